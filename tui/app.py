"""The dashboard application: wiring the feed to the screens, and the global keys.

It is a client of a node's control API only (see docs/control-api.md), so the same
dashboard attaches to a local node or, through an SSH tunnel, to a remote one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches

from gpuflex.client import Endpoint
from tui.api import ControlSource
from tui.feed import Feed, Snapshot
from tui.model import Event
from tui.screens.base import DashboardScreen
from tui.screens.help import HelpScreen
from tui.screens.jobs import JobsScreen
from tui.screens.overview import OverviewScreen
from tui.screens.peers import PeersScreen
from tui.screens.serving import ServingScreen
from tui.source import DataSource

MODE_ORDER = ("overview", "peers", "jobs", "serving")
EVENT_HISTORY = 500


class DashboardApp(App[None]):
    """``clock`` is the wall clock used for "seen 3s ago"; tests fix it for stable snapshots."""

    TITLE = "GPUFlex"
    # Absolute, so subclasses defined elsewhere (the test runner) find it too.
    CSS_PATH = Path(__file__).with_name("dashboard.tcss")
    MODES: ClassVar = {"overview": OverviewScreen, "peers": PeersScreen, "jobs": JobsScreen, "serving": ServingScreen}
    DEFAULT_MODE = "overview"
    HORIZONTAL_BREAKPOINTS: ClassVar = [(0, "-narrow"), (120, "-wide")]
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("1", "show('overview')", "Overview"),
        Binding("2", "show('peers')", "Peers"),
        Binding("3", "show('jobs')", "Jobs"),
        Binding("4", "show('serving')", "Serving"),
        Binding("tab", "cycle(1)", "Next", show=False, priority=True),
        Binding("shift+tab", "cycle(-1)", "Previous", show=False, priority=True),
    ]

    def __init__(
        self,
        source: DataSource,
        *,
        interval: float = 1.0,
        call_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.source = source
        self.clock = clock
        self.call_timeout = call_timeout
        self.events: deque[Event] = deque(maxlen=EVENT_HISTORY)
        self.feed = Feed(
            source,
            self._on_snapshot,
            self._on_event,
            interval=interval,
            timeout=call_timeout,
            wall_clock=clock,
        )

    @property
    def snapshot(self) -> Snapshot:
        return self.feed.snapshot

    def on_mount(self) -> None:
        # Workers are cancelled with the app, so the loops need no shutdown of their own.
        self.run_worker(self.feed.poll_forever(), name="poll", group="feed")
        self.run_worker(self.feed.follow_events(), name="events", group="feed")

    async def on_unmount(self) -> None:
        self.workers.cancel_group(self, "feed")
        with contextlib.suppress(Exception):
            await self.source.aclose()

    def _visible(self) -> DashboardScreen | None:
        # While the app shuts down the stack empties under a running worker, and
        # ``self.screen`` would raise; there is then nothing to draw on.
        stack = self.screen_stack
        if not stack:
            return None
        if isinstance(stack[-1], DashboardScreen):
            return stack[-1]
        # A modal (help) is on top: keep drawing the dashboard screen underneath it.
        under = stack[-2] if len(stack) > 1 else None
        return under if isinstance(under, DashboardScreen) else None

    def _on_snapshot(self, snap: Snapshot) -> None:
        self._draw(lambda screen: screen.show(snap))

    def _on_event(self, event: Event) -> None:
        self.events.append(event)
        self._draw(lambda screen: screen.show_events(self.events))

    def _draw(self, paint: Callable[[DashboardScreen], None]) -> None:
        """Data arrives on its own schedule, also while a screen is being built or torn
        down (switching, quitting); a screen without its widgets is skipped, and it pulls
        the latest data itself once it is shown."""
        screen = self._visible()
        if screen is None or not screen.is_mounted:
            return
        with contextlib.suppress(NoMatches):
            paint(screen)

    def action_show(self, mode: str) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        if self.current_mode != mode:
            self.switch_mode(mode)

    def action_cycle(self, step: int) -> None:
        index = MODE_ORDER.index(self.current_mode) if self.current_mode in MODE_ORDER else 0
        self.action_show(MODE_ORDER[(index + step) % len(MODE_ORDER)])

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


def run_dashboard(
    home: str | os.PathLike[str] | None = None, endpoint: Endpoint | None = None
) -> None:
    """Open the dashboard on the node that owns ``home`` (or on ``endpoint``, e.g. a port
    forwarded over SSH). It starts even when no node is up yet and keeps retrying, so it can
    be launched before the node or left open across node restarts."""
    source = ControlSource(endpoint) if endpoint is not None else ControlSource.for_home(home)
    DashboardApp(source).run()
