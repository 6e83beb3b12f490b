"""How one job is going on this node: a record the roles update only through its methods."""

from __future__ import annotations

from dataclasses import dataclass

import trio

from gpuflex.node.core.kinds import JobState, Phase, Role


@dataclass
class StatusRecord:
    """How this node's share of a job is going; written only through its methods."""

    state: JobState = JobState.PENDING
    phase: Phase = Phase.IDLE
    role: Role = Role.IDLE
    phase_started: float = 0.0  # trio time
    phase_deadline: float | None = None  # trio time
    error: str = ""
    waiting: str = ""  # why this node cannot commit now (too few members reachable)
    write_error: str = ""  # the last failed ledger write, until one succeeds
    stalled: str = ""  # why the last attempt of the current round did not commit
    steps_replayed: int = 0  # committed models rebuilt from the encoded step, not downloaded

    def set_phase(self, phase: Phase, deadline: float | None = None) -> None:
        self.phase, self.phase_started, self.phase_deadline = phase, trio.current_time(), deadline

    def set_role(self, role: Role) -> None:
        self.role = role

    def start(self) -> None:
        self.state = JobState.RUNNING

    def finish(self) -> None:
        self.state, self.phase, self.role = JobState.DONE, Phase.DONE, Role.IDLE

    def fail(self, error: str) -> None:
        self.state, self.error = JobState.FAILED, error

    def set_waiting(self, note: str) -> bool:
        """Record why the job cannot commit ("" when it can); True if that changed."""
        changed, self.waiting = note != self.waiting, note
        return changed

    def write_failed(self, error: str) -> bool:
        """Record a failed ledger write; True when it is a new failure, to be reported."""
        new, self.write_error = error != self.write_error, error
        return new

    def write_recovered(self) -> bool:
        """A write succeeded; True when it ends a failure, to be reported."""
        was, self.write_error = bool(self.write_error), ""
        return was

    def stall(self, why: str) -> None:
        self.stalled = why

    def replayed_step(self) -> None:
        self.steps_replayed += 1

    def progress(self, now: float) -> float:
        if self.phase in (Phase.TRAIN, Phase.REDUCE) and self.phase_deadline:
            span = max(1e-6, self.phase_deadline - self.phase_started)
            return min(1.0, (now - self.phase_started) / span)
        return 1.0 if self.state == JobState.DONE else 0.0
