"""A key known by hearsay alone is never planned nor counted toward ``min_nodes``.

Its signed NodeInfo reaching a node through another peer makes it ``up`` for gossip
(``PeerTable.vouch``), and presence signed by it can be forwarded by anyone holding the key:
neither shows that a process answers for it. A plan made now counts only peers this node heard
from itself (docs/security.md, "Open jobs and Sybils").
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio
import trio.testing

from gpuflex.node.clock import DeadlineClock
from gpuflex.node.core.messages import JOB
from gpuflex.node.nodeport import NodePort
from gpuflex.node.roles.coordinator import SPEAK_WAIT_S, Coordinator
from gpuflex.node.state import JobBook, JobInfo
from mesh.codec import open_envelope, seal
from mesh.health import UP, PeerState, PeerTable
from mesh.identity import Identity
from tests.unit.node.fakenet import fast_spec


def test_a_member_up_by_hearsay_is_not_planned_nor_counted_toward_min_nodes(tmp_path: Path) -> None:
    me, honest, sybil = (Identity(bytes([i]) * 32) for i in (1, 2, 3))
    table = PeerTable()
    table.seen(honest.peer_id)  # it spoke to this node over its own connection
    table.add(sybil.peer_id, ["/ip4/127.0.0.1/tcp/1"])
    table.vouch(sybil.peer_id)  # its signed NodeInfo came through another peer
    assert table.get(sybil.peer_id).state == UP and sybil.peer_id in table.alive()  # a gossip member
    port = NodePort(cast(Any, SimpleNamespace(peers=table)), cast(Any, None), tmp_path, "job", cast(Any, None))
    assert port.heard_peers() == [honest.peer_id]

    spec = fast_spec(min_nodes=2)
    frame = seal(me, JOB, {"spec": spec.to_dict(), "members": [me.peer_id], "created": 0})
    info = JobInfo(job_id=open_envelope(frame).digest[:16], spec=spec, initial_members=(me.peer_id,),
                   frame=frame, submitted_by=me.peer_id)

    async def main() -> None:
        book = JobBook(info, me.peer_id, tmp_path / "job")
        for peer in (honest.peer_id, sybil.peer_id):  # both present, the Sybil's forwarded by anyone
            book.saw_presence(peer, 10.0)
        assert book.live_members(port.heard_peers()) == sorted([me.peer_id, honest.peer_id])
        table.seen(sybil.peer_id)  # once it speaks for itself, it is a member like any other
        assert sybil.peer_id in book.live_members(port.heard_peers())

    trio.run(main, clock=trio.testing.MockClock())


class ReachPort:
    """Just what ``Coordinator._reach_unheard`` reads of a port: who is heard, health, and
    ``reach``, which only ``answering`` peers answer."""

    def __init__(self, heard: set[str], up: set[str], answering: set[str]) -> None:
        self.heard, self.up, self.answering = heard, up, answering
        self.asked: list[list[str]] = []
        self.clock = DeadlineClock()

    def heard_peers(self) -> list[str]:
        return sorted(self.heard)

    def health(self, peer: str) -> PeerState | None:
        return PeerState.UP if peer in self.up else None

    async def reach(self, peers: list[str]) -> None:
        self.asked.append(list(peers))
        self.heard |= self.answering & set(peers)


def test_a_coordinator_waits_for_hearsay_members_pings_the_silent_and_plans_those_that_answer(tmp_path: Path) -> None:
    me, honest, newcomer, ghost = (Identity(bytes([i]) * 32).peer_id for i in (1, 2, 3, 4))
    spec = fast_spec(min_nodes=2)
    owner = Identity(bytes([1]) * 32)
    frame = seal(owner, JOB, {"spec": spec.to_dict(), "members": [me, honest, newcomer], "created": 0})
    info = JobInfo(job_id=open_envelope(frame).digest[:16], spec=spec, initial_members=(me, honest, newcomer),
                   frame=frame, submitted_by=me)
    # ``newcomer`` is a member whose first word has not reached this node yet; ``ghost`` is a
    # key whose presence someone forwards. Both are up by hearsay alone.
    port = ReachPort(heard={honest}, up={honest, newcomer, ghost}, answering={newcomer})

    async def main() -> None:
        book = JobBook(info, me, tmp_path / "job")
        book.saw_presence(ghost, 10.0)
        coordinator = Coordinator(cast(Any, port), book)
        began = trio.current_time()
        await coordinator._reach_unheard()
        assert trio.current_time() - began >= SPEAK_WAIT_S  # it gave them time to speak first
        assert port.asked == [sorted([newcomer, ghost])]
        assert book.live_members(port.heard_peers()) == sorted([me, honest, newcomer])
        # A member that speaks while the coordinator waits is planned with no ping at all.
        port.asked.clear()
        port.heard.discard(newcomer)
        book.saw_presence(ghost, 10.0)

        async def speaks() -> None:
            await trio.sleep(0.5)
            port.heard.add(newcomer)
            book.saw_presence(newcomer, 10.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(speaks)
            await coordinator._reach_unheard()
        assert port.asked == [[ghost]]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_coordinator_waits_for_last_round_contributors_it_has_no_record_of(tmp_path: Path) -> None:
    """A contributor of the last committed round that this node has no record of at all
    (health unknown: a large mesh's node keeps none of most peers) is given the same moment to
    speak as a member known by hearsay, then pinged; before, it was simply left out."""
    me, honest, contributor = (Identity(bytes([i]) * 32).peer_id for i in (1, 2, 3))
    spec = fast_spec(min_nodes=2)
    owner = Identity(bytes([1]) * 32)
    frame = seal(owner, JOB, {"spec": spec.to_dict(), "members": [me, honest], "created": 0})
    info = JobInfo(job_id=open_envelope(frame).digest[:16], spec=spec, initial_members=(me, honest),
                   frame=frame, submitted_by=me)
    port = ReachPort(heard={honest}, up={honest}, answering={contributor})

    async def main() -> None:
        book = JobBook(info, me, tmp_path / "job")
        last = SimpleNamespace(contributors=[{"peer": p} for p in (me, honest, contributor)])
        book.ledger = cast(Any, SimpleNamespace(results=[last]))  # what _unheard reads of a ledger
        book.eligible = lambda: [me, honest, contributor]  # type: ignore[method-assign]
        coordinator = Coordinator(cast(Any, port), book)
        assert coordinator._unheard() == [contributor]
        began = trio.current_time()
        await coordinator._reach_unheard()
        assert trio.current_time() - began >= SPEAK_WAIT_S
        assert port.asked == [[contributor]] and contributor in port.heard_peers()
        port.up.add(contributor)  # it answered: up, and heard first-hand
        assert coordinator._unheard() == []

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_coordinator_waits_longer_while_more_contributors_are_silent_than_it_would_ping(tmp_path: Path) -> None:
    """In a large mesh many of the last round's contributors are still applying its model when
    the next coordinator plans: their presence comes a moment later. With more of them silent
    than it would ping, it waits for them (``SPEAK_WAIT_MORE_S`` at most) until few enough are
    left to ping; at 1,000 simulated nodes it planned 666 of 991 after the short wait alone."""
    from gpuflex.node.roles.coordinator import REACH_AT_ONCE, SPEAK_WAIT_MORE_S

    me, honest = (Identity(bytes([i]) * 32).peer_id for i in (1, 2))
    late = [Identity(bytes([i % 251 + 3, i // 251 + 1]) * 16).peer_id for i in range(REACH_AT_ONCE * 2)]
    spec = fast_spec(min_nodes=2)
    owner = Identity(bytes([1]) * 32)
    frame = seal(owner, JOB, {"spec": spec.to_dict(), "members": [me, honest], "created": 0})
    info = JobInfo(job_id=open_envelope(frame).digest[:16], spec=spec, initial_members=(me, honest),
                   frame=frame, submitted_by=me)
    port = ReachPort(heard={honest}, up={honest}, answering=set(late))

    async def main() -> None:
        book = JobBook(info, me, tmp_path / "job")
        last = SimpleNamespace(contributors=[{"peer": p} for p in (me, honest, *late)])
        book.ledger = cast(Any, SimpleNamespace(results=[last]))
        book.eligible = lambda: [me, honest]  # type: ignore[method-assign]
        coordinator = Coordinator(cast(Any, port), book)

        async def they_speak() -> None:  # after the short wait, each in turn
            await trio.sleep(SPEAK_WAIT_S + 0.5)
            for p in late:
                await trio.sleep(0.01)
                port.heard.add(p)
                port.up.add(p)
                book.changed.notify()

        began = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(they_speak)
            await coordinator._reach_unheard()
            waited = trio.current_time() - began
            heard = set(port.heard_peers())  # as it plans: the ones that spoke, and the ones pinged
        assert SPEAK_WAIT_S < waited < SPEAK_WAIT_S + SPEAK_WAIT_MORE_S + 1.0, waited
        assert len(port.asked) <= 1 and all(len(a) <= REACH_AT_ONCE for a in port.asked)
        assert set(late) <= heard, f"{len(set(late) - heard)} of {len(late)} left out"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
