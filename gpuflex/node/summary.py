"""The JobSummary of the control API (docs/control-api.md), built from a job's status record
and its state, never from the roles' internals."""

from __future__ import annotations

from typing import Any

from gpuflex.node.core.kinds import JobState, Phase
from gpuflex.node.core.ledger import result_row
from gpuflex.node.state import JobBook
from gpuflex.privacy import epsilon_spent

#: The per-round metrics the summary lists (and exports write as columns); a language
#: model's rounds also have a perplexity (None for the others).
METRIC_KEYS = ("loss", "accuracy", "perplexity", "train_loss", "contributors", "duration_s", "update_bytes",
               "down_bytes")
#: Members a summary lists by id (``member_count`` says how many there are): a job's member
#: list comes from its publisher, and a status line must stay small however long it is.
LISTED_MEMBERS = 64


def members_gone_note(count: int) -> str:
    """The job status note of a job none of whose members is reachable."""
    return (f"all {count} members of this job are gone (offline or unknown); "
            "waiting for one to return, at no cost")


def metric_rows(book: JobBook) -> list[dict[str, Any]]:
    """One row per committed round: who coordinated and the round's metrics."""
    return [{"round": x.round, "coordinator": x.coordinator, **{k: x.metrics.get(k) for k in METRIC_KEYS}}
            for x in book.ledger.results]


def summarize(book: JobBook, now: float) -> dict[str, Any]:
    """The JobSummary of docs/control-api.md; ``now`` is trio time (phase progress)."""
    spec, status, rs = book.spec, book.status, book.current
    plan = rs.plan if rs.round == book.committed + 1 else None
    results = book.ledger.results
    coordinator = plan.coordinator if plan else (results[-1].coordinator if results else None)
    progress = status.progress(now)
    col = rs.collectors.get(plan.attempt) if plan else None
    if col is not None and status.phase == Phase.REDUCE:
        progress = col.progress
    members = list(plan.members) if plan else book.eligible()
    return {
        "job_id": book.job_id, "name": spec.name, "state": str(status.state), "round": book.committed,
        "rounds": spec.rounds, "phase": str(status.phase), "phase_progress": round(progress, 3),
        "coordinator": coordinator, "is_coordinator": coordinator == book.me, "role": str(status.role),
        "members": members[:LISTED_MEMBERS], "member_count": len(members), "error": status.error,
        "gone": gone_rows(book),
        "waiting": status.waiting if status.state == JobState.RUNNING else "", "write_error": status.write_error,
        "stalled": status.stalled if status.state == JobState.RUNNING
        and status.stalled.startswith(f"round {book.committed + 1} ") else "",
        "attempt": plan.attempt if plan else 0, "tree": dict(plan.parent) if plan else {},
        "model_hash": book.head_model, "steps_replayed": status.steps_replayed,
        "epsilon": epsilon_spent(spec, book.committed) if spec.uses_dp else None,
        "epsilon_budget": spec.dp_epsilon_budget or None,
        "metrics": metric_rows(book),
        "compute_budget_s": spec.compute_budget_s or None,
        "device": book.device,
        "fit": dict(book.fit),
        "work": work_rows(book),
    }


def gone_rows(book: JobBook) -> list[dict[str, str]]:
    """The members whose presence says the job failed there, and why, as each one says
    (``JobBook.left``; bounded and printable when it arrived): they are left out of plans, so
    ``job status`` names them instead of a round retrying for them in silence. At most
    ``LISTED_MEMBERS``, by peer id."""
    return [{"peer": peer, "reason": why} for peer, why in sorted(book.left.items())[:LISTED_MEMBERS]]


def work_rows(book: JobBook) -> list[dict[str, Any]]:
    """The last committed round's work per member (device, local steps, training seconds,
    samples per second, share of the round's compute), as its result recorded it; at most
    ``LISTED_MEMBERS`` of them (the ledger has them all)."""
    results = book.ledger.results
    return result_row(results[-1])["contributors"][:LISTED_MEMBERS] if results else []


#: The fields of a job in ``status``: one line each in ``gpuflex status``.
BRIEF_KEYS = ("job_id", "name", "state", "round", "rounds", "phase", "coordinator", "waiting")


def brief(summary: dict[str, Any]) -> dict[str, Any]:
    """A job as ``status`` lists it: a few fields, whatever the job's size."""
    return {k: summary[k] for k in BRIEF_KEYS}


def ledger_rows(book: JobBook) -> list[dict[str, Any]]:
    """The ledger as the API's rows, one per committed round."""
    return [result_row(x) for x in book.ledger.whole_results()]
