"""Text captures of the three screens at 80x24 and 160x48, compared with stored files.

Regenerate after an intended change with:

    TUI_SNAPSHOT_UPDATE=1 .venv/bin/python -m pytest tests/tui/test_snapshots.py

and review the diff of tests/tui/snapshots/ like any other change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.pilot import Pilot

from tests.tui.capture import screen_text
from tests.tui.conftest import drive, loaded, make_app, until
from tests.tui.fake_source import JOB_ID
from tui.app import DashboardApp
from tui.screens.jobs import JobsScreen

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("TUI_SNAPSHOT_UPDATE") == "1"


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
@pytest.mark.parametrize("key,mode", [("1", "overview"), ("2", "peers"), ("3", "jobs")])
def test_screen_snapshot(key: str, mode: str, size: tuple[int, int]) -> None:
    captured: list[str] = []

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: loaded(app))
        await pilot.press(key)
        if mode == "jobs":
            await until(
                pilot,
                lambda: isinstance(app.screen, JobsScreen) and JOB_ID in app.screen.ledgers,
                what="ledger",
            )
        # The footer is drawn last: a busy machine may not have drawn it within a fixed pause.
        await until(pilot, lambda: "Quit" in screen_text(app).rstrip().splitlines()[-1], what="the footer")
        await pilot.pause(0.1)
        captured.append(screen_text(app))

    # A long interval: the first poll fills the screen, and nothing moves afterwards.
    drive(make_app(interval=60), scenario, size)
    path = SNAPSHOTS / f"{mode}_{size[0]}x{size[1]}.txt"
    if UPDATE or not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_text(captured[0], encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"wrote a new snapshot {path.name}; review it and run again")
    assert captured[0] == path.read_text(encoding="utf-8"), (
        f"{path.name} differs; if intended, rerun with TUI_SNAPSHOT_UPDATE=1"
    )
