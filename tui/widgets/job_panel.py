"""The current job at a glance: where the round is, who leads it, and what this node does
in it. This is the panel that answers "is my node doing useful work?"."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from tui import format as fmt
from tui.model import PHASES, Job

ROLE_STYLES = {"root": "bold magenta", "leader": "bold cyan", "member": "green", "idle": "dim"}


class JobPanel(Vertical):
    DEFAULT_CSS = """
    JobPanel { height: auto; padding: 0 1; }
    JobPanel Static { height: 1; }
    JobPanel ProgressBar { height: 1; }
    JobPanel #round-bar Bar { width: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="job-title")
        yield ProgressBar(total=1.0, show_eta=False, id="round-bar")
        yield Static(id="job-roles")

    def show(self, job: Job | None, self_id: str) -> None:
        title, roles = self.query_one("#job-title", Static), self.query_one("#job-roles", Static)
        bar = self.query_one("#round-bar", ProgressBar)
        if job is None:
            title.update(Text("no job yet — submit one with 'gpuflex job submit'", style="dim"))
            roles.update("")
            bar.update(progress=0.0)
            return
        title.update(job_title(job))
        bar.update(progress=job.round_progress())
        roles.update(job_roles(job, self_id))


def job_title(job: Job) -> Text:
    text = Text()
    text.append(fmt.literal(job.name or "job", style="bold"))
    text.append(f" {fmt.short_hash(job.job_id, 8)} ", style="dim")
    text.append(job.state, style=fmt.JOB_STATE_STYLES.get(job.state, ""))
    text.append(f"  round {job.round}/{job.rounds}  ")
    for i, phase in enumerate(PHASES):
        if i:
            text.append("▸", style="dim")
        style = "bold reverse" if phase == job.phase else "dim"
        text.append(f" {phase} " if phase == job.phase else phase, style=style)
    return text


def job_roles(job: Job, self_id: str) -> Text:
    text = Text("coordinator ")
    text.append(fmt.literal(fmt.short_id(job.coordinator), style="bold"))
    if job.is_coordinator or (self_id and job.coordinator == self_id):
        text.append(" (this node)", style="bold magenta")
    text.append("   role ")
    text.append(fmt.literal(job.role, style=ROLE_STYLES.get(job.role, "")))
    text.append(f"   members {len(job.members)}")
    return text
