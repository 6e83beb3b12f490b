"""The node's recent events, newest at the bottom like a tail -f.

It draws from the app's bounded history instead of keeping its own buffer, so switching
screens never loses or duplicates a line, and it shows as many lines as fit."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

from tui import format as fmt
from tui.model import Event

EVENT_STYLES = {
    "peer_up": "green",
    "peer_suspect": "yellow",
    "peer_down": "bold red",
    "round_committed": "bold green",
    "round_retried": "yellow",
    "job_done": "bold green",
    "rejected": "bold red",
    "plan_received": "cyan",
    "job_received": "cyan",
    "update_sent": "blue",
    "update_received": "blue",
    "partial_verified": "magenta",
    "partial_sent": "magenta",
    "node_started": "dim",
}


class EventLog(Widget):
    DEFAULT_CSS = """
    EventLog {
        height: 1fr; border: round $primary; border-title-color: $text; padding: 0 1;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "events"
        self._events: Sequence[Event] = ()

    def show(self, events: Sequence[Event]) -> None:
        self._events = events
        self.refresh()

    def render(self) -> Text:
        lines = self.content_size.height or 1
        recent = list(self._events)[-lines:]
        if not recent:
            return Text("no events yet", style="dim")
        return Text("\n", no_wrap=True, overflow="ellipsis").join(format_event(e) for e in recent)


def format_event(event: Event) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(fmt.clock_time(event.ts), style="dim")
    text.append(" ")
    text.append(fmt.literal(f"{event.type:<16}", style=EVENT_STYLES.get(event.type, "")))
    text.append(" ")
    detail = event.message
    if not detail:
        parts = [
            f"round {event.round}" if event.round is not None else "",
            fmt.short_id(event.peer) if event.peer else "",
        ]
        detail = " ".join(p for p in parts if p)
    text.append(fmt.literal(detail))
    return text
