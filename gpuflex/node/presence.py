"""What a node's presence says about its jobs, and to whom each presence message goes.

Presence goes to each job's members alone, one message per set of jobs a peer shares with
this node, so no message grows with the number of jobs on the mesh (docs/architecture.md).
In a job of more than ``PRESENCE_TO_ALL`` members it goes to a bounded few of them
(``recipients``), so what a member sends does not grow with the job either. Like every round
message it has a builder (``make_presence``) and a parser (``parse_presence``): the jobs code
only ever sees typed, bounded values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from gpuflex.node.core.ledger import LedgerClaim
from gpuflex.node.core.messages import MAX_ROUND, PRESENCE
from gpuflex.node.core.workfields import WireValue
from gpuflex.node.core.workplan import valid_rate
from gpuflex.node.port import JobPort
from gpuflex.safetext import printable
from mesh.codec import Envelope, WireError, WireReason, seal
from mesh.identity import Identity
from mesh.overlay import neighbours
from mesh.reachability import Reachability
from mesh.reachability import parse as parse_reachability
from mesh.vivaldi import Coordinate, from_wire

#: Jobs a presence names as still preparing, as passing a round's turns, or as failed: bounded,
#: so many jobs arriving together do not push presence past its kind's size limit.
PRESENCE_MARKS = 16
#: Why a job failed on a peer, as its presence says: at most this many characters are kept.
FAILED_REASON_CHARS = 200
#: A job of at most this many members: each member's presence goes to every other.
PRESENCE_TO_ALL = 32
#: Otherwise to this many of the members, spread as the overlay spreads neighbours (ledger
#: heads travel on from there), and to the next rounds' coordinators (this many attempts'),
#: who plan by presence (throughput, still preparing, passing a turn, reachability).
PRESENCE_SPREAD, PRESENCE_COORDINATORS = 16, 3
#: ... and to as many of the first reachable candidates among this many attempts: a candidate
#: behind NAT passes its turn while a reachable one is up, so with most members at home the
#: round's plan comes from a later attempt. At 100 simulated members, nine in ten at home, it
#: came at attempts 4 to 49, and its coordinator had no presence, so no reachability, of most
#: members: it took homes for reachable and placed them as leaders.
PRESENCE_COORDINATOR_SCAN = 64


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
    coord: Coordinate | None = None  # where it sits on the network (``mesh.vivaldi``), if said
    reach: Reachability | None = None  # whether others can dial it, if said (``mesh.reachability``)


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
        for job, last in jobs.items() if isinstance(job, str)}, failed, from_wire(body.get("coord")),
        said if (said := parse_reachability(body.get("reach"))) != Reachability.UNKNOWN else None)


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
                  failed: dict[str, str], coord: list[float] | None = None,
                  reach: Reachability | None = None) -> dict[str, Any]:
    """One presence for the jobs ``active`` (job → committed rounds) and ``failed`` (job → why).

    Throughput: coordinators of time-budgeted rounds plan by it. Ledger head and weight
    (verified contributions): a peer whose ledger is lighter, or as heavy on another head,
    learns to fetch ours. Jobs still preparing, and the round whose coordinator turns this node
    passes: peers skip those turns instead of waiting out a plan timeout. The node's network
    coordinate (``mesh.vivaldi``): coordinators group members by nearness. Its reachability:
    a coordinator places members behind NAT below reachable leaders, and in a large mesh it
    may hold no NodeInfo of a member it hears only by presence (at 100 simulated nodes one in
    fifteen home members was placed as a reachable leader for want of one)."""
    rates = {j: round(r, 3) for j in active if (r := drivers[j].throughput()) > 0}
    heads = {j: drivers[j].head() for j in active}
    weights = {j: drivers[j].weight for j in active}
    preparing = list(islice((j for j in active if drivers[j].preparing), PRESENCE_MARKS))
    passes = dict(islice(((j, r) for j in active if (r := drivers[j].passes_round)), PRESENCE_MARKS))
    return {"jobs": active, "heads": heads, "weights": weights, "rates": rates,
            "preparing": preparing, "passes": passes, **({"failed": failed} if failed else {}),
            **({"coord": coord} if coord is not None else {}),
            **({"reach": reach.value} if reach is not None and reach != Reachability.UNKNOWN else {})}


def make_presence(identity: Identity, drivers: Mapping[str, PresenceSource], active: dict[str, int],
                  failed: dict[str, str], coord: list[float] | None = None,
                  reach: Reachability | None = None) -> bytes:
    """A signed presence for ``active`` and ``failed`` jobs (``presence_body``)."""
    return seal(identity, PRESENCE, presence_body(drivers, active, failed, coord, reach))


def group_recipients(shared: Mapping[str, list[str]]) -> dict[tuple[str, ...], list[str]]:
    """Peers grouped by the jobs they share with this node: one presence message per group."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for peer, in_jobs in shared.items():
        groups.setdefault(tuple(in_jobs), []).append(peer)
    return groups


class RoundView(Protocol):
    """What ``recipients`` reads of a job's round state (``gpuflex.node.state``)."""

    def coordinator_order(self) -> list[str]: ...

    @property
    def current(self) -> Any: ...


def next_coordinators(order: Sequence[str], behind_nat: Callable[[str], bool]) -> set[str]:
    """The candidates of the first ``PRESENCE_COORDINATORS`` attempts (``order``: attempt
    order), and the first as many of the first ``PRESENCE_COORDINATOR_SCAN`` that are not
    known to be behind NAT: one of those plans the round when the first candidates are homes."""
    first = set(order[:PRESENCE_COORDINATORS])
    reachable = [p for p in order[:PRESENCE_COORDINATOR_SCAN] if not behind_nat(p)]
    return first | set(reachable[:PRESENCE_COORDINATORS])


def recipients(me: str, members: set[str], driver: Any, cache: dict[str, Any]) -> set[str]:
    """Whom one job's presence goes to (``members``: the job's members this node has up):
    every member in a small job; in a larger one the ``PRESENCE_SPREAD`` members the overlay
    would link this node to (recomputed only when the members change, kept in ``cache``), the
    next coordinators (``next_coordinators``, as ``driver.port`` says of their reachability),
    and this node's parent and children in the current round's tree (``driver.book``, its round
    state). A next coordinator this node keeps no record of (a large mesh's table holds a
    bounded few) is sent to too, if it is a known member of the job: without its presence, a
    coordinator does not plan a member that sat a round out, and at 1,000 simulated nodes
    rounds 2 and 3 planned 666 and 627 of the 1,000."""
    if len(members) <= PRESENCE_TO_ALL:
        return members - {me}
    key = frozenset(members)
    if cache.get("key") != key:
        cache["key"], cache["spread"] = key, neighbours(me, members, PRESENCE_SPREAD)
    book: RoundView = driver.book
    port: JobPort = driver.port
    round_ = book.current.round
    if cache.get("round") != round_:  # a rendezvous ranking of every eligible member: once a round
        cache["round"], cache["coordinators"] = round_, next_coordinators(book.coordinator_order(), port.behind_nat)
    out = set(cache["spread"]) | cache["coordinators"]
    plan = book.current.plan
    if plan is not None and me in plan.parent:
        out.update(p for p, up in plan.parent.items() if up == me)
        out.add(plan.parent[me] or me)
    unrecorded = {c for c in cache["coordinators"] - members if port.health(c) is None}
    out &= members
    if unrecorded:  # the job's known members, a set of every presence held: built only when needed
        out |= unrecorded & driver.known_members()
    return out - {me}
