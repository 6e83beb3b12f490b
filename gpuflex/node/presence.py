"""Presence: what a node tells each job's members about itself, and to whom.

Each job's presence goes to that job's members alone (``JobBook.known_members``: peers that
sent presence for it, its initial members and possible coordinators, its submitter), one
message per set of jobs a peer shares with this node. No presence names a job its recipient
is not in, none grows with the number of jobs on the mesh, and a node in no job sends none.
The members of each running job are also handed to the mesh's failure detection
(``MeshNode.watch``), chosen as the overlay chooses, so that no member is watched by all.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from itertools import islice
from typing import Any, Protocol

import trio

from gpuflex.node.kinds import JobState
from gpuflex.node.messages import PRESENCE
from mesh.codec import WireError, open_envelope, seal
from mesh.messaging import Inbound, Rejected
from mesh.node import MeshNode
from mesh.overlay import neighbours

log = logging.getLogger("gpuflex.jobs")
#: Jobs a presence names as still preparing, as giving up a round's turns, or as failed:
#: bounded, so many jobs at once do not push presence past its 8 KiB limit.
PRESENCE_MARKS = 16
#: Members of each running job watched first-hand besides the overlay neighbours.
WATCH_PER_JOB = 16


class Members(Protocol):
    def known_members(self) -> set[str]: ...


class PresentJob(Protocol):
    """What presence reads of one job (``JobDriver``)."""

    @property
    def state(self) -> Any: ...

    @property
    def committed(self) -> int: ...

    @property
    def weight(self) -> int: ...

    @property
    def preparing(self) -> bool: ...

    @property
    def passes_round(self) -> int: ...

    @property
    def failure(self) -> str | None: ...

    def participates(self) -> bool: ...

    def throughput(self) -> float: ...

    def head(self) -> str: ...

    @property
    def book(self) -> Members: ...


def presence_body(jobs: Mapping[str, PresentJob], active: dict[str, int], failed: dict[str, str]) -> dict[str, Any]:
    # Each job's training throughput here: coordinators of time-budgeted rounds plan by it.
    rates = {j: round(r, 3) for j in active if (r := jobs[j].throughput()) > 0}
    # Each job's ledger head and weight (its verified contributions): a peer whose ledger is
    # lighter, or as heavy on another head, learns from this to fetch ours.
    heads = {j: jobs[j].head() for j in active}
    weights = {j: jobs[j].weight for j in active}
    # Jobs still being prepared here, and the round whose coordinator turns this node gave
    # up meanwhile: peers skip those turns instead of waiting out a plan timeout.
    preparing = list(islice((j for j in active if jobs[j].preparing), PRESENCE_MARKS))
    passes = dict(islice(((j, r) for j in active if (r := jobs[j].passes_round)), PRESENCE_MARKS))
    return {"jobs": active, "heads": heads, "weights": weights, "rates": rates,
            "preparing": preparing, "passes": passes, **({"failed": failed} if failed else {})}


async def send_presence(mesh: MeshNode, jobs: Mapping[str, PresentJob], apply_own: Callable[[Inbound], Awaitable[Any]],
                        watch_s: float) -> None:
    """One presence period: applied here first (as a broadcast would be), then to each job's
    members; running jobs' members watched for ``watch_s``."""
    # Finished jobs too: a member that fell behind (a full disk, a partition) catches up.
    active = {j: d.committed for j, d in jobs.items() if d.state != JobState.FAILED and d.participates()}
    # Jobs that failed here, and why: peers leave this node out of their plans and say why.
    failed = dict(islice(((j, why) for j, d in jobs.items() if (why := d.failure)), PRESENCE_MARKS))
    if not active and not failed:  # a node in no job sends nothing
        return
    me = mesh.peer_id
    try:
        own = seal(mesh.identity, PRESENCE, presence_body(jobs, active, failed))
        await apply_own(Inbound(open_envelope(own), None, me, gossip=True))
    except (WireError, ValueError, Rejected) as exc:  # a map too large for its kind's limit
        log.debug("own presence not applied: %s", exc)
    alive = set(mesh.peers.alive())
    shared: dict[str, list[str]] = {}
    for job in [*active, *failed]:
        members = jobs[job].book.known_members() & alive
        for peer in members - {me}:
            shared.setdefault(peer, []).append(job)
        if jobs[job].state == JobState.RUNNING:  # its rounds' members, spread evenly
            mesh.watch(neighbours(me, members, WATCH_PER_JOB), watch_s)
    groups: dict[tuple[str, ...], list[str]] = {}
    for peer, in_jobs in shared.items():
        groups.setdefault(tuple(in_jobs), []).append(peer)
    async with trio.open_nursery() as nursery:
        for group, peers in groups.items():
            try:
                frame = seal(mesh.identity, PRESENCE, presence_body(
                    jobs, {j: active[j] for j in group if j in active}, {j: failed[j] for j in group if j in failed}))
            except (WireError, ValueError) as exc:
                log.debug("presence for %d job(s) not sent: %s", len(group), exc)
                continue
            nursery.start_soon(mesh.send_direct, frame, peers)
