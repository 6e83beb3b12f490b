"""The two lines at the top of every screen: which node, how healthy its mesh is, and
which screen is showing. They answer "is my node alive and connected?" before anything
else, so every screen carries them."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpuflex.safetext import plural
from tui import format as fmt
from tui.feed import Snapshot

TABS = (("overview", "1", "Overview"), ("peers", "2", "Peers"), ("jobs", "3", "Jobs"))


class Masthead(Static):
    DEFAULT_CSS = """
    Masthead { height: 2; background: $panel; padding: 0 1; }
    """

    def show(self, snap: Snapshot, active: str) -> None:
        self.update(render_masthead(snap, active))


def render_masthead(snap: Snapshot, active: str) -> Text:
    text = Text()
    text.append("GPUFlex ", style="bold")
    status = snap.status
    if status is not None:
        text.append(fmt.literal(fmt.short_id(status.peer_id), style="bold cyan"))
        if status.version:
            text.append(fmt.literal(f" v{status.version}", style="dim"))
        if status.uptime_s is not None:
            text.append(f" up {fmt.human_duration(status.uptime_s)}", style="dim")
    else:
        text.append("no node yet", style="dim")
    text.append("   ")
    for mode, key, label in TABS:
        style = "bold reverse" if mode == active else ""
        text.append(f" {key} {label} ", style=style)
    text.append("\n")
    if status is None:
        text.append("mesh: waiting for the node", style="dim")
        return text
    mesh = status.mesh
    text.append(f"mesh {plural(mesh.peers, 'peer')}  ")
    for label, count in (("up", mesh.up), ("suspect", mesh.suspect), ("down", mesh.down)):
        style = fmt.STATE_STYLES[label] if count else "dim"
        text.append("● ", style=style)
        text.append(f"{count} {label}  ", style=style)
    return text
