"""Shared helpers for the dashboard tests.

The repository runs pytest with trio_mode, and Textual needs asyncio, so these tests are
plain functions that drive an asyncio loop themselves (``drive``) instead of async tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from textual.pilot import Pilot

from tests.tui.fake_source import NOW, FakeSource
from tui.app import DashboardApp
from tui.source import DataSource

Scenario = Callable[[DashboardApp, Pilot[None]], Awaitable[None]]


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Event times are printed in local time; pin the zone so captures match anywhere."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def make_app(source: DataSource | None = None, interval: float = 0.05) -> DashboardApp:
    return DashboardApp(
        source or FakeSource(), interval=interval, call_timeout=1.0, clock=lambda: NOW
    )


#: A whole scenario's bound. It takes 1-3 s on an idle machine, but textual waits for the app
#: to be idle after every key, and with the suite's four workers and another process on the
#: same two cores one scenario took over 30 s; a hung one still fails within this.
SCENARIO_TIMEOUT_S = 120.0


def drive(app: DashboardApp, scenario: Scenario, size: tuple[int, int] = (80, 24)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await scenario(app, pilot)

    asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT_S))


async def until(
    pilot: Pilot[None],
    predicate: Callable[[], object],
    timeout: float = 20.0,
    what: str = "condition",
) -> None:
    """Wait for the app to reach a state; polling keeps tests fast and free of fixed sleeps.
    The bound is generous for a loaded machine: a state that is reached returns at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)
    await pilot.pause()


def loaded(app: DashboardApp) -> bool:
    return bool(app.snapshot.connected and app.snapshot.peers and len(app.events) >= 9)
