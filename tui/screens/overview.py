"""The default screen: the one an operator leaves open over SSH to see, at a glance,
whether the node is doing useful work and whether the job is healthy."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal

from tui.feed import Snapshot
from tui.model import Event, current_job
from tui.screens.base import DashboardScreen
from tui.widgets.event_log import EventLog
from tui.widgets.job_panel import JobPanel
from tui.widgets.metrics_chart import MetricsChart


class OverviewScreen(DashboardScreen):
    MODE = "overview"

    def compose_body(self) -> ComposeResult:
        yield JobPanel()
        with Horizontal(id="overview-body"):
            yield MetricsChart(id="chart")
            yield EventLog(id="log")

    def show_body(self, snap: Snapshot) -> None:
        job = current_job(list(snap.jobs))
        self_id = snap.status.peer_id if snap.status else ""
        self.query_one(JobPanel).show(job, self_id)
        self.query_one(MetricsChart).show(job)

    def show_events(self, events: Sequence[Event]) -> None:
        self.query_one(EventLog).show(events)
