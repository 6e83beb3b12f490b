"""What a node's presence says about its jobs, and to whom each presence message goes.

Presence goes to each job's members alone, one message per set of jobs a peer shares with
this node, so no message grows with the number of jobs on the mesh (docs/architecture.md).
Like every round message it has a builder (``make_presence``) and a parser
(``parse_presence``): the jobs code only ever sees typed, bounded values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from gpuflex.node.core.ledger import LedgerClaim
from gpuflex.node.core.messages import MAX_ROUND, PRESENCE
from gpuflex.node.core.workfields import WireValue
from gpuflex.node.core.workplan import valid_rate
from gpuflex.safetext import printable
from mesh.codec import Envelope, WireError, WireReason, seal
from mesh.identity import Identity

#: Jobs a presence names as still preparing, as passing a round's turns, or as failed: bounded,
#: so many jobs arriving together do not push presence past its kind's size limit.
PRESENCE_MARKS = 16
#: Why a job failed on a peer, as its presence says: at most this many characters are kept.
FAILED_REASON_CHARS = 200


@dataclass(frozen=True)
class JobPresence:
    """What a peer's presence says of one job it takes part in, each value typed and bounded
    (a value of the wrong type reads as unsaid: None, False)."""

    claim: LedgerClaim  # its ledger: committed rounds, weight, head
    rate: float | None = None  # its training throughput, samples per second
    preparing: bool = False  # still loading the job: skip its coordinator turns
    passes: int | None = None  # the round whose coordinator turns it passes

    @classmethod
    def from_wire(cls, last_round: WireValue, head: WireValue = None, rate: WireValue = None,
                  weight: WireValue = None, *, preparing: bool = False, passes: WireValue = None) -> JobPresence:
        passed = (passes if isinstance(passes, int) and not isinstance(passes, bool)
                  and 1 <= passes <= MAX_ROUND else None)
        return cls(LedgerClaim.from_wire(last_round, weight, head), valid_rate(rate), preparing, passed)


@dataclass(frozen=True)
class Presence:
    """One parsed presence message."""

    sender: str
    jobs: dict[str, JobPresence]  # the jobs it takes part in
    failed: dict[str, str]  # jobs that failed there, none of them in ``jobs``, and why ("" unsaid)


def _map(body: dict[str, Any], name: str) -> dict[Any, Any]:
    value = body.get(name)
    return value if isinstance(value, dict) else {}


def parse_presence(env: Envelope) -> Presence:
    """A presence's body checked: a job map is required; every other field is optional and a
    malformed one reads as unsaid, as a node that sends fewer fields would be read."""
    body = env.body
    jobs = body.get("jobs") if isinstance(body, dict) else None
    if not isinstance(body, dict) or not isinstance(jobs, dict):
        raise WireError(WireReason.GARBLED, "presence without a job map")
    heads, weights, rates, passes = (_map(body, name) for name in ("heads", "weights", "rates", "passes"))
    preparing = body.get("preparing")
    preparing = {j for j in preparing if isinstance(j, str)} if isinstance(preparing, list) else set()
    failed = {job: printable(why, FAILED_REASON_CHARS) if isinstance(why, str) and why else ""
              for job, why in islice(_map(body, "failed").items(), PRESENCE_MARKS)
              if isinstance(job, str) and job not in jobs}
    return Presence(env.sender, {
        job: JobPresence.from_wire(last, heads.get(job), rates.get(job), weights.get(job),
                                   preparing=job in preparing, passes=passes.get(job))
        for job, last in jobs.items() if isinstance(job, str)}, failed)


class PresenceSource(Protocol):
    """What presence reads of one job's driver."""

    @property
    def preparing(self) -> bool: ...

    @property
    def passes_round(self) -> int: ...

    @property
    def weight(self) -> int: ...

    def throughput(self) -> float: ...

    def head(self) -> str: ...


def presence_body(drivers: Mapping[str, PresenceSource], active: dict[str, int],
                  failed: dict[str, str]) -> dict[str, Any]:
    """One presence for the jobs ``active`` (job → committed rounds) and ``failed`` (job → why).

    Throughput: coordinators of time-budgeted rounds plan by it. Ledger head and weight
    (verified contributions): a peer whose ledger is lighter, or as heavy on another head,
    learns to fetch ours. Jobs still preparing, and the round whose coordinator turns this node
    passes: peers skip those turns instead of waiting out a plan timeout."""
    rates = {j: round(r, 3) for j in active if (r := drivers[j].throughput()) > 0}
    heads = {j: drivers[j].head() for j in active}
    weights = {j: drivers[j].weight for j in active}
    preparing = list(islice((j for j in active if drivers[j].preparing), PRESENCE_MARKS))
    passes = dict(islice(((j, r) for j in active if (r := drivers[j].passes_round)), PRESENCE_MARKS))
    return {"jobs": active, "heads": heads, "weights": weights, "rates": rates,
            "preparing": preparing, "passes": passes, **({"failed": failed} if failed else {})}


def make_presence(identity: Identity, drivers: Mapping[str, PresenceSource], active: dict[str, int],
                  failed: dict[str, str]) -> bytes:
    """A signed presence for ``active`` and ``failed`` jobs (``presence_body``)."""
    return seal(identity, PRESENCE, presence_body(drivers, active, failed))


def group_recipients(shared: Mapping[str, list[str]]) -> dict[tuple[str, ...], list[str]]:
    """Peers grouped by the jobs they share with this node: one presence message per group."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for peer, in_jobs in shared.items():
        groups.setdefault(tuple(in_jobs), []).append(peer)
    return groups
