"""What a node's presence says about its jobs, and to whom each presence message goes.

Presence goes to each job's members alone, one message per set of jobs a peer shares with
this node, so no message grows with the number of jobs on the mesh (docs/architecture.md).
In a job of more than ``PRESENCE_TO_ALL`` members it goes to a bounded few of them
(``recipients``), so what a member sends does not grow with the job either.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import Any, Protocol

from mesh.overlay import neighbours

#: Jobs a presence names as still preparing, or as giving up a round's turns: bounded, so many
#: jobs arriving together do not push presence past its kind's size limit.
PRESENCE_MARKS = 16
#: A job of at most this many members: each member's presence goes to every other.
PRESENCE_TO_ALL = 32
#: Otherwise to this many of the members, spread as the overlay spreads neighbours (ledger
#: heads travel on from there), and to the next rounds' coordinators (this many attempts'),
#: who plan by presence (throughput, still preparing, gave up a turn).
PRESENCE_SPREAD, PRESENCE_COORDINATORS = 16, 3


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
                  failed: dict[str, str], coord: list[float] | None = None) -> dict[str, Any]:
    """One presence for the jobs ``active`` (job → committed rounds) and ``failed`` (job → why).

    Throughput: coordinators of time-budgeted rounds plan by it. Ledger head and weight
    (verified contributions): a peer whose ledger is lighter, or as heavy on another head,
    learns to fetch ours. Jobs still preparing, and the round whose coordinator turns this node
    gave up: peers skip those turns instead of waiting out a plan timeout. The node's network
    coordinate (``mesh.vivaldi``): coordinators group members by nearness."""
    rates = {j: round(r, 3) for j in active if (r := drivers[j].throughput()) > 0}
    heads = {j: drivers[j].head() for j in active}
    weights = {j: drivers[j].weight for j in active}
    preparing = list(islice((j for j in active if drivers[j].preparing), PRESENCE_MARKS))
    passes = dict(islice(((j, r) for j in active if (r := drivers[j].passes_round)), PRESENCE_MARKS))
    return {"jobs": active, "heads": heads, "weights": weights, "rates": rates,
            "preparing": preparing, "passes": passes, **({"failed": failed} if failed else {}),
            **({"coord": coord} if coord is not None else {})}


def group_recipients(shared: Mapping[str, list[str]]) -> dict[tuple[str, ...], list[str]]:
    """Peers grouped by the jobs they share with this node: one presence message per group."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for peer, in_jobs in shared.items():
        groups.setdefault(tuple(in_jobs), []).append(peer)
    return groups


class RoundView(Protocol):
    """What ``recipients`` reads of a job's round state (``gpuflex.node.state``)."""

    def expected_coordinator(self, attempt: int) -> str | None: ...

    @property
    def current(self) -> Any: ...


def recipients(me: str, members: set[str], driver: Any, cache: dict[str, Any]) -> set[str]:
    """Whom one job's presence goes to: every member in a small job; in a larger one the
    ``PRESENCE_SPREAD`` members the overlay would link this node to (recomputed only when
    the members change, kept in ``cache``), the coordinators of the next attempts, and this
    node's parent and children in the current round's tree (``driver.book``, its round state)."""
    if len(members) <= PRESENCE_TO_ALL:
        return members - {me}
    key = frozenset(members)
    if cache.get("key") != key:
        cache["key"], cache["spread"] = key, neighbours(me, members, PRESENCE_SPREAD)
    book: RoundView = driver.book
    round_ = book.current.round
    if cache.get("round") != round_:  # a rendezvous ranking of every eligible member: once a round
        cache["round"], cache["coordinators"] = round_, {
            c for a in range(PRESENCE_COORDINATORS) if (c := book.expected_coordinator(a)) is not None}
    out = set(cache["spread"]) | cache["coordinators"]
    plan = book.current.plan
    if plan is not None and me in plan.parent:
        out.update(p for p, up in plan.parent.items() if up == me)
        out.add(plan.parent[me] or me)
    return (out & members) - {me}
