"""Every peer this node knows, sortable and filterable, with the full record of the one
under the cursor. This is where "which box is dragging the round?" gets answered, and the
dashboard's credit view: each peer's share of the followed job's compute, the rounds it
contributed, and the tokens it served for this node's callers (``srvd``, from the shared
serving view, ``gpuflex.serve.view``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Input

from gpuflex.serve.view import PeerServing
from tui import format as fmt
from tui.feed import Snapshot
from tui.model import MemberWork, NodeInfo, Peer, current_job
from tui.screens.base import DashboardScreen
from tui.widgets.keyed_table import Cell, KeyedTable
from tui.widgets.node_detail import NodeDetail

STATE_ORDER = {"up": 0, "suspect": 1, "down": 2}


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    hotkey: str
    sort_key: Callable[[Peer, MemberWork | None, PeerServing | None], Any]


def device_cell(info: NodeInfo | None) -> str:
    """One short cell: the first accelerator and its memory, or the CPU and its RAM."""
    if info is None:
        return ""
    if info.accelerators:
        acc = info.accelerators[0]
        extra = f"+{len(info.accelerators) - 1}" if len(info.accelerators) > 1 else ""
        return f"{fmt.device_name(acc.name)}{extra} {fmt.human_bytes(acc.memory_bytes)}"
    return f"cpu×{info.cpu_count} {fmt.human_bytes(info.ram_bytes)}"


def _work_key(value: float | None) -> float:
    return -math.inf if value is None else value


# What answers "which box is dragging the round?" comes first, so that an 80-column terminal
# shows it; the rest scrolls into view (the border says so when columns are off screen).
COLUMNS = (
    Column("peer", "peer", "i", lambda p, w, s: p.peer_id),
    Column("state", "state", "t", lambda p, w, s: (STATE_ORDER.get(p.state, 3), p.peer_id)),
    Column("device", "device", "d", lambda p, w, s: device_cell(p.info)),
    # The followed job's last committed round: who did how much, on what.
    Column("rate", "smp/s", "r", lambda p, w, s: _work_key(w.samples_per_s if w else None)),
    Column("share", "shr", "a", lambda p, w, s: _work_key(w.compute_share if w else None)),
    Column("steps", "stp", "x", lambda p, w, s: _work_key(w.steps if w else None)),
    Column("penalty", "pen", "p", lambda p, w, s: p.penalty),
    Column("rtt", "rtt", "l", lambda p, w, s: math.inf if p.rtt_ms is None else p.rtt_ms),
    Column("rounds", "rnds", "c", lambda p, w, s: p.rounds_contributed),
    Column("served", "srvd", "v", lambda p, w, s: s.tokens if s else -1),
    Column("seen", "seen", "e", lambda p, w, s: -(p.last_seen or 0.0)),
    Column("reach", "reach", "h", lambda p, w, s: (p.reachability, p.peer_id)),
    Column("legacy", "lgcy", "g", lambda p, w, s: bool(p.info and p.info.legacy)),
)
DEVICE_CHARS = 14
COLUMN_BY_KEY = {c.key: c for c in COLUMNS}


def work_by_peer(snap: Snapshot) -> dict[str, MemberWork]:
    """Each member's work in the last committed round of the job the dashboard follows."""
    job = current_job(list(snap.jobs))
    return {w.peer: w for w in job.work} if job else {}


def served_by_peer(snap: Snapshot) -> dict[str, PeerServing]:
    """Each peer's serving credit: the tokens it made for this node's callers, its mismatches."""
    return {c.peer: c for c in snap.serving.credit}


def served_cell(served: PeerServing | None) -> Text:
    """Tokens served, red with a ``!`` when a redundancy check penalised the peer."""
    if served is None:
        return Text(fmt.DASH, justify="right")
    flag = "!" if served.penalised else ""
    return Text(f"{served.tokens}{flag}", style="red" if served.penalised else "", justify="right")


def _figure(value: float | None, text: str) -> Text:
    return Text(fmt.DASH if value is None else text, justify="right")


def peer_cells(peer: Peer, now: float, work: MemberWork | None = None, served: PeerServing | None = None) -> list[Cell]:
    legacy = Text("yes", style="yellow") if peer.info and peer.info.legacy else Text("")
    penalty = Text(f"{peer.penalty:.2f}", style="red" if peer.penalty > 0 else "dim")
    device = device_cell(peer.info) or fmt.DASH
    return [
        fmt.short_id(peer.peer_id),
        fmt.literal(peer.state, style=fmt.STATE_STYLES.get(peer.state, "")),
        device if len(device) <= DEVICE_CHARS else device[: DEVICE_CHARS - 1] + "…",
        _figure(work.samples_per_s if work else None, f"{work.samples_per_s:.0f}" if work and work.samples_per_s
                is not None else ""),
        _figure(work.compute_share if work else None, f"{work.compute_share:.0%}" if work and work.compute_share
                is not None else ""),
        _figure(None if work is None or work.steps is None else float(work.steps), str(work.steps if work else "")),
        penalty,
        Text(fmt.rtt(peer.rtt_ms), justify="right"),
        Text(str(peer.rounds_contributed), justify="right"),
        served_cell(served),
        Text(fmt.ago(peer.last_seen, now), justify="right"),
        fmt.literal(peer.reachability + ("·r" if peer.connection == "relayed" else ""),
                    style=fmt.REACH_STYLES.get(peer.reachability, "")),
        legacy,
    ]


def matches(peer: Peer, needle: str) -> bool:
    """Case-insensitive substring over what a person would type: id, state, device."""
    if not needle:
        return True
    haystack = " ".join(
        [
            peer.peer_id,
            peer.state,
            peer.reachability,
            device_cell(peer.info),
            "legacy" if peer.info and peer.info.legacy else "",
        ]
    )
    return needle.lower() in haystack.lower()


class PeersScreen(DashboardScreen):
    MODE = "peers"
    BINDINGS = [  # noqa: RUF012 - Textual's convention
        Binding("slash", "filter", "Filter"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        *(Binding(c.hotkey, f"sort('{c.key}')", f"Sort by {c.label}", show=False) for c in COLUMNS),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sort_column = "state"
        self.sort_reverse = False
        self.filter_text = ""

    def compose_body(self) -> ComposeResult:
        with Vertical(id="peers-body"):
            yield KeyedTable([(c.key, c.label) for c in COLUMNS], id="peer-table")
            yield NodeDetail(id="peer-detail")
        yield Input(
            placeholder="filter peers: id, state, device… (enter keeps, esc clears)",
            id="peer-filter",
        )

    def on_mount(self) -> None:
        self._relabel()
        self.query_one(KeyedTable).focus()
        # Column widths settle after layout and the user scrolls sideways at will: re-checked
        # twice a second, the border's hint is always current.
        self.set_interval(0.5, self._scroll_hint)

    # -- data -------------------------------------------------------------------------

    def visible_peers(self, snap: Snapshot) -> list[Peer]:
        column = COLUMN_BY_KEY[self.sort_column]
        shown = [p for p in snap.peers if matches(p, self.filter_text)]
        work, served = work_by_peer(snap), served_by_peer(snap)
        return sorted(shown, key=lambda p: column.sort_key(p, work.get(p.peer_id), served.get(p.peer_id)),
                      reverse=self.sort_reverse)

    def show_body(self, snap: Snapshot) -> None:
        now = self.dashboard.clock()
        table = self.query_one(KeyedTable)
        work, served = work_by_peer(snap), served_by_peer(snap)
        table.set_rows([(p.peer_id, peer_cells(p, now, work.get(p.peer_id), served.get(p.peer_id)))
                        for p in self.visible_peers(snap)])
        count = f"{table.row_count}/{len(snap.peers)}" if self.filter_text else str(table.row_count)
        table.border_title = fmt.literal(
            f"peers {count}" + (f" · filter '{self.filter_text}'" if self.filter_text else "")
        )
        self.call_after_refresh(self._scroll_hint)
        self._show_detail()

    def on_resize(self) -> None:
        self.call_after_refresh(self._scroll_hint)

    def _scroll_hint(self) -> None:
        """Say so on the border when columns lie off screen, and which way they are."""
        table = self.query_one(KeyedTable)
        hidden_right = table.virtual_size.width > table.scroll_x + table.scrollable_content_region.width
        hidden_left = table.scroll_x > 0
        arrows = ("← " if hidden_left else "") + ("→" if hidden_right else "")
        table.border_subtitle = f"{arrows.strip()} more columns: ←/→ scroll" if arrows else ""

    def _selected_peer(self) -> Peer | None:
        key = self.query_one(KeyedTable).selected_key()
        return next((p for p in self.dashboard.snapshot.peers if p.peer_id == key), None)

    def _show_detail(self) -> None:
        self.query_one(NodeDetail).show(self._selected_peer(), self.dashboard.clock())

    def _relabel(self) -> None:
        arrow = "▼" if self.sort_reverse else "▲"
        self.query_one(KeyedTable).set_labels(
            {c.key: f"{c.label}{arrow}" if c.key == self.sort_column else c.label for c in COLUMNS}
        )

    # -- sorting ----------------------------------------------------------------------

    def action_sort(self, key: str) -> None:
        """Pressing the current column's key again flips the order, as in htop."""
        if key == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = key, False
        self._relabel()
        self.show_body(self.dashboard.snapshot)

    def action_cycle_sort(self) -> None:
        keys = [c.key for c in COLUMNS]
        self.action_sort(keys[(keys.index(self.sort_column) + 1) % len(keys)])

    def action_reverse_sort(self) -> None:
        self.action_sort(self.sort_column)

    @on(DataTable.HeaderSelected)
    def _header_clicked(self, event: DataTable.HeaderSelected) -> None:
        self.action_sort(str(event.column_key.value))

    # -- selection --------------------------------------------------------------------

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self) -> None:
        self._show_detail()

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter copies the full id: the one thing people paste into other commands."""
        peer_id = str(event.row_key.value)
        self.app.copy_to_clipboard(peer_id)
        self.notify(f"copied {peer_id}", title="peer id", timeout=3, markup=False)
        self._show_detail()

    # -- filtering --------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#peer-filter", Input)
        box.display = True
        # Focus now, not on the next tick (widget.focus() defers), so keys typed right
        # after "/" (fast typists, pastes, tmux send-keys) land in the box, not the sort keys.
        self.set_focus(box)

    def action_clear_filter(self) -> None:
        box = self.query_one("#peer-filter", Input)
        box.value = ""
        box.display = False
        self.query_one(KeyedTable).focus()

    @on(Input.Changed, "#peer-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.show_body(self.dashboard.snapshot)

    @on(Input.Submitted, "#peer-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        box = self.query_one("#peer-filter", Input)
        box.display = bool(event.value.strip())
        self.query_one(KeyedTable).focus()
