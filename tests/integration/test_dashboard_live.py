"""The dashboard attached to a real three-node mesh shows the round counter advance."""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.integration.conftest import digits_spec
from tests.tui.capture import screen_text
from tui.api import ControlSource
from tui.app import DashboardApp

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_round_counter_advances_on_screen(mesh_factory) -> None:
    mesh = mesh_factory(3)
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    seen: list[int] = []
    jobs: list[str] = []

    async def main() -> None:
        app = DashboardApp(ControlSource.for_home(mesh.home(1)), interval=0.5)
        async with app.run_test(size=(100, 30)) as pilot:
            loop = asyncio.get_running_loop()
            # The job starts once the dashboard is up and drawing: submitted before it, six
            # short rounds could all commit before its first frame (one run saw only "6/6").
            await pilot.pause(1.0)
            jobs.append(await loop.run_in_executor(None, mesh.submit, digits_spec(rounds=6, local_epochs=1)))
            deadline = loop.time() + 180
            while loop.time() < deadline:
                await pilot.pause(0.5)
                match = re.search(r"round (\d+)/6", screen_text(app))
                if match:
                    value = int(match.group(1))
                    if not seen or value != seen[-1]:
                        seen.append(value)
                if len(seen) >= 3 or (seen and seen[-1] == 6):
                    break
            await pilot.press("q")

    asyncio.run(main())
    assert len(seen) >= 2, f"round counter never advanced on screen: {seen}"
    assert seen == sorted(seen)
    mesh.wait_job(jobs[0], [0, 1, 2], timeout=180)
