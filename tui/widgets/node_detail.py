"""The full record behind a peer row: everything the table had to shorten or leave out.
A NodeInfo is what the peer says about itself, so every value is drawn literally."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tui import format as fmt
from tui.model import Peer


class NodeDetail(Static):
    DEFAULT_CSS = """
    NodeDetail { border: round $primary; padding: 0 1; height: auto; max-height: 12; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "peer"

    def show(self, peer: Peer | None, now: float) -> None:
        if peer is None:
            self.update(Text("select a peer to see its NodeInfo", style="dim"))
            return
        self.update(peer_details(peer, now))


def peer_details(peer: Peer, now: float) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("peer id", fmt.literal(peer.peer_id))
    state = fmt.literal(peer.state, style=fmt.STATE_STYLES.get(peer.state, ""))
    state.append(
        f"  rtt {fmt.rtt(peer.rtt_ms)}  seen {fmt.ago(peer.last_seen, now)} ago"
        f"  rounds {peer.rounds_contributed}  penalty {peer.penalty:.2f}",
        style="",
    )
    grid.add_row("state", state)
    info = peer.info
    if info is None:
        grid.add_row("info", Text("not published yet", style="dim"))
    else:
        grid.add_row(
            "system",
            fmt.literal(
                f"{info.os} · {info.cpu_count} cpu · "
                f"{fmt.human_bytes(info.ram_bytes)} ram · "
                f"torch {info.torch or fmt.DASH} · v{info.version}"
            ),
        )
        for acc in info.accelerators or ():
            grid.add_row(
                fmt.literal(acc.kind or "gpu"),
                fmt.literal(
                    f"{acc.name} · {fmt.human_bytes(acc.memory_bytes)}"
                    f" · compute {acc.capability or '?'}"
                ),
            )
        if not info.accelerators:
            grid.add_row("gpu", Text("none (CPU only)", style="dim"))
        if info.legacy:
            grid.add_row("legacy", Text("yes: compute capability below 7.0", style="yellow"))
    addrs = peer.addrs or (info.addrs if info else ())
    addr_lines = Text("\n").join(fmt.literal(a) for a in addrs) if addrs else fmt.DASH
    grid.add_row("addrs", addr_lines)
    return grid
