"""The key reference. The footer only has room for the common keys, so the rest live here."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("1 2 3 4", "overview, peers, jobs, serving"),
    ("tab / shift+tab", "next / previous screen"),
    ("↑ ↓ pgup pgdn", "move in a table"),
    ("?", "this help"),
    ("q", "quit"),
    ("", ""),
    ("peers", ""),
    ("/", "filter (enter keeps it, esc clears it)"),
    ("enter", "copy the full peer id"),
    ("s / S", "next sort column / reverse order"),
    ("i t h l e d g c x r a p v", "sort by id, state, reach, rtt, seen, device, legacy, rounds, steps, samples/s, "
                                  "compute share (last round), penalty, tokens served"),
    ("", ""),
    ("jobs", ""),
    ("enter", "open the job's ledger"),
    ("esc", "back to the job list"),
)


def key_table() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, what in KEYS:
        table.add_row(key, what, style="bold" if key and not what else "")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [  # noqa: RUF012 - Textual's convention
        Binding("escape,question_mark,q", "dismiss", "Close"),
        # A modal hides the app's keys; the screen keys should still work from here.
        Binding("1", "app.show('overview')", show=False),
        Binding("2", "app.show('peers')", show=False),
        Binding("3", "app.show('jobs')", show=False),
        Binding("4", "app.show('serving')", show=False),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; padding: 0 2; background: $surface;
    }
    """

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "GPUFlex dashboard — keys"
            box.border_subtitle = "esc to close"
            yield Static(key_table())
