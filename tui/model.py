"""The dashboard's view of the control API's JSON: the model it shares with the portal
(gpuflex.client.model), and which job the overview follows.

Parsing is lenient there: a missing or null field becomes a default instead of an exception,
and the screens only ever see these types.
"""

from __future__ import annotations

from gpuflex.client.model import (
    PHASES,
    Accelerator,
    Event,
    Job,
    LedgerRound,
    MemberWork,
    Mesh,
    NodeInfo,
    Peer,
    RoundMetrics,
    Status,
    as_list,
)

__all__ = [
    "PHASES", "Accelerator", "Event", "Job", "LedgerRound", "MemberWork", "Mesh", "NodeInfo", "Peer",
    "RoundMetrics", "Status", "as_list", "current_job",
]


def current_job(jobs: list[Job]) -> Job | None:
    """The job the overview follows: the newest running one, else the newest of all (the
    API lists jobs newest first)."""
    for job in jobs:
        if job.state == "running":
            return job
    return jobs[0] if jobs else None
