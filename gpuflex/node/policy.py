"""The one policy for what goes wrong in a job: bad input from a peer, and failed writes.

Bad input gets a clear event (which the log shows), a penalty for the peer to blame, and is
dropped; the node keeps serving. A ledger write that fails (a full disk) is reported once,
kept on the status until a write succeeds, and then reported as recovered.
"""

from __future__ import annotations

from gpuflex.node.core.kinds import EventKind
from gpuflex.node.port import JobPort
from gpuflex.node.status import StatusRecord
from mesh.fsutil import StateWriteError


class IncidentPolicy:
    """What a job does when something goes wrong: the roles report each incident here."""

    def __init__(self, port: JobPort, status: StatusRecord, job_id: str) -> None:
        self.port, self.status, self.job_id = port, status, job_id

    def rejected(self, peer: str, round_: int | None, message: str) -> None:
        """``peer`` sent something that does not verify: say so, penalise it, drop it."""
        self.port.emit(EventKind.REJECTED, round_, peer, message=message)
        self.port.penalise(peer)

    def write_failed(self, round_: int, exc: StateWriteError) -> None:
        """A ledger write failed (a full disk): the file keeps the previous rounds, this node
        stays up, and presence from peers brings it up to date once a write succeeds."""
        if self.status.write_failed(str(exc)):
            self.port.emit(EventKind.STATE_WRITE_FAILED, round_, message=(
                f"job {self.job_id}: round {round_} not recorded: {exc}; the previous ledger is kept, "
                "catching up from peers once the disk has room"))

    def write_recovered(self, height: int) -> None:
        if self.status.write_recovered():
            self.port.emit(EventKind.STATE_WRITE_RECOVERED, height, message=(
                f"job {self.job_id}: the ledger is saved again, at round {height}"))
