"""Attempt convergence on the fake transport, under trio's MockClock: a node that ran ahead of
its peers on attempts (it missed their plan, as one that restarted does) comes back to the
attempt they are in, and an abort for a plan it keeps for later drops that plan.

The node hears its peers late by a chosen delay (a deaf window): it gives up waiting for
attempt 0's plan and moves on, then the plan arrives. Two paths bring it back: the plan
arrives while it waits for a later attempt (taken up at once), or while it works in a later
attempt (kept in ``RoundState.behind``, taken up when it next waits).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.messages import ABORT, Plan
from mesh.codec import open_envelope, seal
from mesh.messaging import Inbound
from tests.unit.node.fakenet import FakeNet, FakeNode, fast_spec
from tests.unit.node.test_round_protocol import contributors, one_ledger

pytestmark = pytest.mark.timeout(10)
#: Until this mock time, messages to the deaf nodes are held back (plan_timeout is 3 s).
DEAF_UNTIL = 5.0


def deaf(net: FakeNet, senders: set[str] | None, receivers: set[str]) -> Callable[[FakeNode, FakeNode], float]:
    """Messages from ``senders`` (anyone, if None) to ``receivers`` land at ``DEAF_UNTIL``."""
    def jitter(a: FakeNode, b: FakeNode) -> float:
        held = b.peer_id in receivers and (senders is None or a.peer_id in senders)
        return max(0.01, DEAF_UNTIL - trio.current_time()) if held else 0.01
    return jitter


def owners(net: FakeNet, attempts: int) -> list[FakeNode]:
    """The node whose turn each of the first ``attempts`` attempts of round 1 is."""
    return [net.ranking(1, a)[0] for a in range(attempts)]


def took_up(node: FakeNode, attempt: int) -> list[float]:
    """When ``node`` put a plan for ``attempt`` in force."""
    return [e.at for e in node.events
            if e.kind == EventKind.PLAN_RECEIVED and f" for attempt {attempt} with " in e.message]


async def test_a_node_ahead_on_attempts_takes_up_the_plan_its_peers_are_in(autojump_clock, tmp_path) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=1, min_nodes=4))  # the round needs every node
    first, _, _, late = owners(net, 4)  # ``late`` owns none of attempts 0-2: it only waits
    net.jitter = deaf(net, None, {late.peer_id})
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await trio.sleep(DEAF_UNTIL - 0.5)
        rs = late.driver.book.current
        assert rs.attempt >= 1 and rs.plan is None, "the late node moved past attempt 0 with no plan"
        await net.wait_rounds(1)
        (res,) = one_ledger(net, 1)
        nursery.cancel_scope.cancel()
    assert res.attempt == 0 and res.coordinator == first.peer_id
    assert contributors(res) == set(net.order), "min_nodes=4: the late node's update made the round"
    # It was waiting for attempt 1's plan when attempt 0's came: it took it up at once.
    assert took_up(late, 0) and DEAF_UNTIL <= min(took_up(late, 0)) < DEAF_UNTIL + 0.1


def split_attempts(net: FakeNet) -> tuple[FakeNode, FakeNode, FakeNode, FakeNode]:
    """(first, second, member, other): ``member`` and ``second`` hear ``first`` late, so they
    work in attempt 1 (``second``'s plan) while ``first`` and ``other`` work in attempt 0."""
    first, second = owners(net, 2)
    member, other = [n for n in net.nodes.values() if n not in (first, second)]
    net.jitter = deaf(net, {first.peer_id}, {second.peer_id, member.peer_id})
    return first, second, member, other


async def busy_with_attempt_1_keeping_plan_0(net: FakeNet, member: FakeNode) -> Plan:
    await trio.sleep(DEAF_UNTIL + 0.5)
    rs = member.driver.book.current
    assert rs.plan is not None and rs.plan.attempt == 1, "the member works in attempt 1"
    assert rs.behind is not None and rs.behind.attempt == 0, "attempt 0's plan came while busy: kept"
    assert not took_up(member, 0)
    return rs.behind


async def test_a_plan_that_arrives_while_busy_is_kept_and_taken_up_when_the_node_next_waits(
        autojump_clock, tmp_path) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=1, min_nodes=3), detect_s=1.0)
    first, second, member, other = split_attempts(net)
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await busy_with_attempt_1_keeping_plan_0(net, member)
        net.kill(second)  # attempt 1 ends on the member: its coordinator is gone
        await net.wait_rounds(1)
        (res,) = one_ledger(net, 1)
        nursery.cancel_scope.cancel()
    assert took_up(member, 0), "the kept plan was taken up once attempt 1 was over"
    assert res.attempt == 0 and res.coordinator == first.peer_id
    assert contributors(res) == {first.peer_id, other.peer_id, member.peer_id}
    assert (1, 0, member.peer_id, first.peer_id) in net.acks


async def test_an_abort_for_a_kept_plan_drops_it(autojump_clock, tmp_path) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=1, min_nodes=3), detect_s=1.0)
    first, second, member, _ = split_attempts(net)
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        kept = await busy_with_attempt_1_keeping_plan_0(net, member)
        # Attempt 0's coordinator gives it up (as a root with too few updates does); the abort
        # reaches the member, which still keeps that plan for later.
        frame = seal(first.identity, ABORT, {"job": net.info.job_id, "round": 1, "attempt": kept.attempt,
                                             "reason": "given up"})
        await member.driver.handle(Inbound(open_envelope(frame), None, first.peer_id, gossip=True))
        rs = member.driver.book.current
        assert rs.behind is None and kept.attempt in rs.aborted
        net.kill(second)  # the member next waits while attempt 0's deadline is still ahead
        await net.wait_rounds(1)
        (res,) = one_ledger(net, 1)
        nursery.cancel_scope.cancel()
    assert not took_up(member, 0), "the member put an aborted attempt's plan in force"
    assert not [a for a in net.acks if a[:3] == (1, 0, member.peer_id)], "the member trained for attempt 0"
    assert res.attempt >= 2 and member.peer_id in contributors(res)
