"""What every dashboard screen shares: the masthead, the connection banner and the footer.

Screens pull the latest Snapshot from the app when they come back into view and are pushed
new ones while visible, so a screen that was hidden for a minute is never stale."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol, cast

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from tui.feed import Snapshot
from tui.model import Event
from tui.widgets.banner import Banner
from tui.widgets.masthead import Masthead


class Dashboard(Protocol):
    """What a screen reads from the app that hosts it (tui.app.DashboardApp): attributes
    down, so no screen imports the app."""

    clock: Callable[[], float]

    @property
    def snapshot(self) -> Snapshot: ...


class DashboardScreen(Screen[None]):
    MODE: ClassVar[str] = ""

    @property
    def dashboard(self) -> Dashboard:
        return cast(Dashboard, self.app)

    def compose(self) -> ComposeResult:
        yield Masthead()
        yield Banner()
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def on_mount(self) -> None:
        self.refresh_all()

    def on_screen_resume(self) -> None:
        self.refresh_all()

    def refresh_all(self) -> None:
        app = self.dashboard
        self.show(app.snapshot)
        self.show_events(app.events)

    def show(self, snap: Snapshot) -> None:
        self.query_one(Masthead).show(snap, self.MODE)
        self.query_one(Banner).show(snap)
        self.show_body(snap)

    def show_body(self, snap: Snapshot) -> None:
        """Draw the screen's own widgets; called on every poll while visible."""

    def show_events(self, events: Sequence[Event]) -> None:
        """Called for each new event while visible; only screens that list events care."""
