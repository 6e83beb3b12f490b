"""What a node's presence says about its jobs, and to whom each presence message goes.

Presence goes to each job's members alone, one message per set of jobs a peer shares with
this node, so no message grows with the number of jobs on the mesh (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import Any, Protocol

#: Jobs a presence names as still preparing, or as giving up a round's turns: bounded, so many
#: jobs arriving together do not push presence past its kind's size limit.
PRESENCE_MARKS = 16


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
    gave up: peers skip those turns instead of waiting out a plan timeout."""
    rates = {j: round(r, 3) for j in active if (r := drivers[j].throughput()) > 0}
    heads = {j: drivers[j].head() for j in active}
    weights = {j: drivers[j].weight for j in active}
    preparing = list(islice((j for j in active if drivers[j].preparing), PRESENCE_MARKS))
    passes = dict(islice(((j, r) for j in active if (r := drivers[j].passes_round)), PRESENCE_MARKS))
    return {"jobs": active, "heads": heads, "weights": weights, "rates": rates,
            "preparing": preparing, "passes": passes, **({"failed": failed} if failed else {})}


def group_recipients(shared: Mapping[str, list[str]]) -> dict[tuple[str, ...], list[str]]:
    """Peers grouped by the jobs they share with this node: one presence message per group."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for peer, in_jobs in shared.items():
        groups.setdefault(tuple(in_jobs), []).append(peer)
    return groups
