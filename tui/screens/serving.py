"""Serving at a glance: every node of the mesh that serves a model, with its load, requests
and tokens per second and latency; the models this node serves itself, with the device, dtype,
batch and KV-cache budget each is fitted to; its batch inference jobs; and the redundancy
checks' latest mismatches. It answers "is my model up, where, and how fast does it answer?"."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from gpuflex.serve.view import Figures, InferenceRun, ServedModel, Server, Serving
from tui import format as fmt
from tui.feed import Snapshot
from tui.screens.base import DashboardScreen
from tui.widgets.keyed_table import Cell, KeyedTable

SERVER_COLUMNS = (
    ("peer", "node"),
    ("models", "models"),
    ("load", "load"),
    ("rps", "req/s"),
    ("tps", "tok/s"),
    ("ttft", "1st tok"),
    ("latency", "latency"),
    ("rtt", "rtt"),
)
MODEL_COLUMNS = (
    ("name", "model"),
    ("source", "source"),
    ("hash", "hash"),
    ("requests", "requests"),
    ("tokens", "tokens"),
    ("errors", "errors"),
    ("fit", "fitted to"),
)
RUN_COLUMNS = (("run", "inference job"), ("name", "name"), ("model", "model"), ("state", "state"),
               ("done", "answers"))
MODELS_SHOWN = 32  # characters of a server's model list


def _right(text: str) -> Text:
    return Text(text, justify="right")


def _ms(value: float | None) -> Text:
    return _right(fmt.DASH if value is None else f"{value:.0f}ms")


def figure_cells(f: Figures) -> list[Cell]:
    return [_right(fmt.DASH if f.rps is None else f"{f.rps:.2f}"),
            _right(fmt.DASH if f.tokens_per_s is None else f"{f.tokens_per_s:.1f}"),
            _ms(f.ttft_ms), _ms(f.latency_ms)]


def server_cells(s: Server) -> list[Cell]:
    models = ", ".join(s.models)
    return [fmt.short_id(s.peer) + (" (me)" if s.is_self else ""),
            models if len(models) <= MODELS_SHOWN else models[: MODELS_SHOWN - 1] + "…",
            _right(f"{s.load}/{s.capacity}"), *figure_cells(s.figures),
            _right("local" if s.is_self else fmt.rtt(s.rtt_ms))]


def model_cells(m: ServedModel) -> list[Cell]:
    return [m.name, m.source if len(m.source) <= 40 else "…" + m.source[-39:], fmt.short_hash(m.model_hash, 12),
            _right(str(m.requests)), _right(str(m.tokens)),
            Text(str(m.errors), style="red" if m.errors else "dim", justify="right"),
            fmt.literal(m.fit.text or fmt.DASH)]


def run_cells(r: InferenceRun) -> list[Cell]:
    return [fmt.short_hash(r.run_id, 8), r.name or fmt.DASH, r.model,
            fmt.literal(r.state, style=fmt.JOB_STATE_STYLES.get(r.state, "")), _right(f"{r.done}/{r.total}")]


def summary(serving: Serving) -> Text:
    """One line above the tables: where the API listens, and what it took in."""
    if serving.empty:
        return Text("This node serves nothing and knows no server: see `gpuflex serve --help`.", style="dim")
    line = Text()
    line.append("API ", style="bold")
    line.append(f"{serving.api}/v1" if serving.api else "off (routing only for peers)")
    t = serving.taken_in
    if t.rps is not None:
        line.append(f"   taken in: {t.rps:.2f} req/s")
    for name, why in serving.failed:
        line.append(f"\n{name}: not loaded: {why[:200]}", style="red")
    for verdict in serving.reports[-3:]:
        line.append(f"\ncheck: {verdict[:200]}", style="yellow")
    return line


class ServingScreen(DashboardScreen):
    MODE = "serving"

    def compose_body(self) -> ComposeResult:
        yield Static(id="serve-summary")
        servers = KeyedTable(SERVER_COLUMNS, id="server-table")
        servers.border_title = "Servers in the mesh"
        yield servers
        models = KeyedTable(MODEL_COLUMNS, id="served-table")
        models.border_title = "Models this node serves"
        yield models
        runs = KeyedTable(RUN_COLUMNS, id="run-table")
        runs.border_title = "Batch inference jobs"
        yield runs

    def show_body(self, snap: Snapshot) -> None:
        serving = snap.serving
        self.query_one("#serve-summary", Static).update(summary(serving))
        self.query_one("#server-table", KeyedTable).set_rows([(s.peer, server_cells(s)) for s in serving.servers])
        self.query_one("#served-table", KeyedTable).set_rows([(m.name, model_cells(m)) for m in serving.models])
        self.query_one("#run-table", KeyedTable).set_rows([(r.run_id, run_cells(r)) for r in serving.runs])
