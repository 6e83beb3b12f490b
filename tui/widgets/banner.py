"""The connection banner. A dashboard that silently shows stale numbers is worse than none,
so losing the node is announced loudly and the banner goes away by itself on reconnect."""

from __future__ import annotations

from textual.widgets import Static

from tui.feed import Snapshot
from tui.format import literal


class Banner(Static):
    DEFAULT_CSS = """
    Banner {
        height: 1; padding: 0 1; display: none; text-style: bold;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    Banner.-connecting { display: block; background: $primary-darken-2; color: $text; }
    Banner.-disconnected { display: block; background: $error; color: $text; }
    """

    def show(self, snap: Snapshot) -> None:
        self.set_class(snap.connected is None, "-connecting")
        self.set_class(snap.connected is False, "-disconnected")
        if snap.connected is None:
            self.update(literal(f"connecting to {snap.where}…"))
        elif snap.connected is False:
            self.update(literal(f"⚠ disconnected — retrying (attempt {snap.attempts}): {snap.error}"))
        else:
            self.update("")
