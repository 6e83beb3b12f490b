"""The jobs this node knows and, for the one under the cursor, its audited history: the
committed rounds from the ledger, with who coordinated and who contributed."""

from __future__ import annotations

import asyncio
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from tui import format as fmt
from tui.feed import Snapshot
from tui.model import Job, LedgerRound, as_list
from tui.screens.base import DashboardScreen
from tui.widgets.keyed_table import Cell, KeyedTable

JOB_COLUMNS = (
    ("job", "job"),
    ("name", "name"),
    ("state", "state"),
    ("round", "round"),
    ("phase", "phase"),
    ("role", "role"),
    ("coordinator", "coordinator"),
)
LEDGER_COLUMNS = (
    ("round", "rnd"),
    ("coordinator", "coordinator"),
    ("contributors", "contrib"),
    ("samples", "samples"),
    ("loss", "loss"),
    ("accuracy", "acc"),
    ("perplexity", "ppl"),
    ("sent", "sent"),
    ("result", "result hash"),
)
#: Gone members the detail pane names one per line; past these, one line says how many more.
GONE_SHOWN = 3


def job_cells(job: Job) -> list[Cell]:
    coordinator = fmt.short_id(job.coordinator) + (" (me)" if job.is_coordinator else "")
    return [
        fmt.short_hash(job.job_id, 8),
        fmt.literal(job.name) if job.name else fmt.DASH,
        fmt.literal(job.state, style=fmt.JOB_STATE_STYLES.get(job.state, "")),
        f"{job.round}/{job.rounds}",
        job.phase,
        job.role,
        coordinator,
    ]


def ledger_cells(entry: LedgerRound, sent: float | None = None) -> list[Cell]:
    """A committed round; ``sent``: the bytes its updates weighed (from the job's metrics)."""
    metrics = entry.metrics
    return [
        Text(str(entry.round), justify="right"),
        fmt.short_id(entry.coordinator),
        Text(str(len(entry.contributors)), justify="right"),
        Text(str(sum(c.samples for c in entry.contributors)), justify="right"),
        fmt.number(metrics.loss if metrics else None),
        fmt.percent(metrics.accuracy if metrics else None),
        Text(fmt.number(metrics.perplexity if metrics else None, 2), justify="right"),
        Text(fmt.human_bytes(sent), justify="right"),
        fmt.short_hash(entry.result_hash, 12),
    ]


def round_key(job_id: str, round_: int) -> str:
    """A ledger row's key names its job too: a cursor left on round 42 of one job must never
    pick round 42 of another for the detail pane."""
    return f"{job_id}:{round_}"


def round_details(entry: LedgerRound) -> Table:
    """Every value here is a peer's (the ledger holds signed messages), so each is literal."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(f"round {entry.round}", fmt.literal(f"coordinator {entry.coordinator or fmt.DASH}"))
    grid.add_row("result", fmt.literal(entry.result_hash or fmt.DASH))
    grid.add_row("prev", fmt.literal(entry.prev_result_hash or fmt.DASH))
    grid.add_row("model", fmt.literal(entry.model_hash or fmt.DASH))
    grid.add_row(
        "contributors",
        fmt.literal(", ".join(f"{fmt.short_id(c.peer)}×{c.samples}" for c in entry.contributors) or fmt.DASH),
    )
    return grid


def gone_lines(job: Job) -> list[Text]:
    """One line per member whose job failed there, with the reason it gave (a peer's words,
    so literal, and cut at the pane's edge): plans leave it out, and the pane says so instead of
    leaving a round to look as if it waits for it. A few, then how many more ``job status``
    lists, so a job with many gone members still shows its round."""
    lines = []
    for gone in job.gone[:GONE_SHOWN]:
        line = fmt.literal(f"✗ gone {fmt.short_id(gone.peer)}: the job failed there ({gone.reason or fmt.DASH})",
                           style="yellow")
        line.no_wrap, line.overflow = True, "ellipsis"
        lines.append(line)
    if len(job.gone) > GONE_SHOWN:
        lines.append(Text(f"✗ {len(job.gone) - GONE_SHOWN} more gone: gpuflex job status lists them", style="yellow"))
    return lines


class JobsScreen(DashboardScreen):
    MODE = "jobs"
    BINDINGS = [  # noqa: RUF012 - Textual's convention
        Binding("escape", "focus_jobs", "Back to jobs", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.ledgers: dict[str, tuple[int, tuple[LedgerRound, ...]]] = {}
        self.ledger_error = ""
        self._loading: str | None = None

    def compose_body(self) -> ComposeResult:
        with Vertical(id="jobs-body"):
            yield KeyedTable(JOB_COLUMNS, id="job-table")
            yield KeyedTable(LEDGER_COLUMNS, id="ledger-table")
            yield Static(id="round-detail")

    def on_mount(self) -> None:
        self.query_one("#job-table", KeyedTable).focus()

    def _selected_job(self) -> Job | None:
        key = self.query_one("#job-table", KeyedTable).selected_key()
        return next((j for j in self.dashboard.snapshot.jobs if j.job_id == key), None)

    def show_body(self, snap: Snapshot) -> None:
        jobs = self.query_one("#job-table", KeyedTable)
        jobs.set_rows([(j.job_id, job_cells(j)) for j in snap.jobs])
        jobs.border_title = f"jobs {len(snap.jobs)}"
        self._show_ledger()

    def _show_ledger(self, fetch: bool = True) -> None:
        """Draw the cached ledger, and fetch it again when the job has committed rounds
        since; the ledger only grows at a commit, so polling it every second is waste.
        After a fetch, ``fetch=False`` leaves a retry to the next poll instead of looping."""
        job = self._selected_job()
        table = self.query_one("#ledger-table", KeyedTable)
        if job is None:
            table.set_rows([])
            table.border_title = "ledger"
            self._show_round()
            return
        cached_round, rounds = self.ledgers.get(job.job_id, (-1, ()))
        if (
            fetch
            and cached_round != job.round
            and self.dashboard.snapshot.connected
            and self._loading != job.job_id
        ):
            self._loading = job.job_id
            self.run_worker(self._load_ledger(job), group="ledger")
        sent = {m.round: m.sent_bytes for m in job.metrics}
        # Newest first; a cursor on the newest round follows each new one (a cursor moved to an
        # older round stays there).
        table.set_rows([(round_key(job.job_id, r.round), ledger_cells(r, sent.get(r.round)))
                        for r in reversed(rounds)], follow_first=True)
        note = f" · {self.ledger_error}" if self.ledger_error else ""
        table.border_title = fmt.literal(f"ledger of {job.name or fmt.short_hash(job.job_id, 8)}{note}")
        self._show_round()

    async def _load_ledger(self, job: Job) -> None:
        app = self.dashboard
        try:
            raw = await asyncio.wait_for(app.source.ledger(job.job_id), app.call_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.ledger_error = f"cannot read ledger: {exc or type(exc).__name__}"
        else:
            self.ledger_error = ""
            rounds = tuple(LedgerRound.parse(r) for r in as_list(raw))
            self.ledgers[job.job_id] = (job.round, rounds)
        finally:
            self._loading = None
        if self.is_mounted:
            self._show_ledger(fetch=False)

    def _show_round(self) -> None:
        detail = self.query_one("#round-detail", Static)
        job = self._selected_job()
        table = self.query_one("#ledger-table", KeyedTable)
        key = table.selected_key() if table.cursor_visible_in_view() else None
        rounds = self.ledgers.get(job.job_id, (0, ()))[1] if job else ()
        entry = next((r for r in rounds if job is not None and round_key(job.job_id, r.round) == key), None)
        shown: Any = Text("no committed round selected", style="dim") if entry is None else round_details(entry)
        if job is not None:  # why the round in flight does not commit, and who is gone, first
            stall = [fmt.literal(f"⚠ {job.stall}", style="bold yellow")] if job.stall else []
            shown = Group(*stall, *gone_lines(job), shown)
        detail.update(shown)

    @on(DataTable.RowHighlighted, "#job-table")
    def _job_highlighted(self) -> None:
        self._show_ledger()

    @on(DataTable.RowHighlighted, "#ledger-table")
    def _round_highlighted(self) -> None:
        self._show_round()

    @on(DataTable.RowSelected, "#job-table")
    def _job_selected(self) -> None:
        """Tab switches screens here, so Enter is the way down into the ledger."""
        self.query_one("#ledger-table", KeyedTable).focus()

    def action_focus_jobs(self) -> None:
        self.query_one("#job-table", KeyedTable).focus()
