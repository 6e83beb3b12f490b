"""Coordinator turns of a node still preparing the job, on the fake transport under MockClock.

A node that is still loading its data and measuring its device when a peer has the job ready
passes its turns in the current round and says so in presence; its peers skip those turns
instead of waiting a plan timeout for it, and it does not plan them once ready either. Nodes
preparing side by side keep the ranking's order.
"""

from __future__ import annotations

import pytest
import trio

from gpuflex.node.core.kinds import EventKind
from gpuflex.node.presence import JobPresence
from tests.unit.node.fakenet import FakeNet, FakeNode, fast_spec
from tests.unit.node.test_budget_rounds import FAST, SLOW, round_lengths
from tests.unit.node.test_round_protocol import contributors, one_ledger

pytestmark = pytest.mark.timeout(20)
#: Mock seconds the late node takes to prepare: far beyond the plan timeout (3 s).
LATE_PREPARE_S = 20.0


def first_plan_at(node: FakeNode) -> float:
    return min(e.at for e in node.events if e.kind == EventKind.PLAN_RECEIVED)


def planned_by(net: FakeNet, node: FakeNode) -> set[int]:
    """The rounds of every plan ``node`` coordinated that any node (itself included) put in force."""
    return {e.round for n in net.nodes.values() for e in n.events
            if e.kind == EventKind.PLAN_RECEIVED and e.peer == node.peer_id and e.round is not None}


async def test_a_node_still_preparing_gives_its_round_1_turn_to_a_ready_one(autojump_clock, tmp_path) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=2, min_nodes=3))
    late, second = net.ranking(1, 0)[0], net.ranking(1, 1)[0]
    late.prepare_s = LATE_PREPARE_S
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        others = [n for n in net.nodes.values() if n is not late]
        await net.wait_rounds(1, others)
        assert late.driver.preparing, "round 1 committed while the late node was still preparing"
        assert all(n.driver.book.passing_now() == set() for n in others), "round 1 is over: no turn is passed"
        await net.wait_rounds(2)
        results = one_ledger(net, 2)
        nursery.cancel_scope.cancel()
    first = results[0]
    assert (first.coordinator, first.attempt) == (second.peer_id, 1), "the next in the ranking planned round 1"
    # Its peers skipped its turn on its word instead of waiting out the 3 s plan timeout.
    assert all(first_plan_at(n) < 3.0 for n in others), [first_plan_at(n) for n in others]
    assert 1 not in planned_by(net, late), "once ready, it planned no round-1 attempt"
    assert late.peer_id not in contributors(first)


async def test_nodes_preparing_side_by_side_keep_the_ranking(autojump_clock, tmp_path) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=1, min_nodes=4))
    for node in net.nodes.values():
        node.prepare_s = 2.0  # well past PASS_TURNS_AFTER_S, but nobody is ready before the others
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(1)
        (res,) = one_ledger(net, 1)
        nursery.cancel_scope.cancel()
    assert (res.coordinator, res.attempt) == (net.ranking(1, 0)[0].peer_id, 0)
    assert all(n.driver.book.passed_round == 0 for n in net.nodes.values())
    assert contributors(res) == set(net.ids())


async def test_a_slow_machine_slow_to_prepare_holds_no_round_of_a_budgeted_job(autojump_clock, tmp_path) -> None:
    """The mixed-hardware case: the slowest machine is also the last to be ready, and round 1's
    ranking names it first. Round 1 runs without it on the ready nodes' budget; from round 2 it
    contributes every round and, recorded as slow, never coordinates."""
    budget = 10.0
    net = FakeNet(tmp_path, 4, fast_spec(rounds=4, min_nodes=3, compute_budget_s=budget, train_timeout_s=0.0,
                                         group_size=2))
    slow = net.ranking(1, 0)[0]
    for node in net.nodes.values():
        node.rate = SLOW if node is slow else FAST
    slow.prepare_s = 5.0
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(4)
        results = one_ledger(net, 4)
        nursery.cancel_scope.cancel()
    fast = net.alive_nodes()[1] if net.alive_nodes()[0] is slow else net.alive_nodes()[0]
    assert first_plan_at(fast) < 3.0, "round 1 started without waiting for the slow node"
    assert all(length <= budget + 1.0 for length in round_lengths(fast).values()), round_lengths(fast)
    assert slow.peer_id not in contributors(results[0]), "it published no throughput before round 1's plan"
    assert all(slow.peer_id in contributors(res) for res in results[1:]), "it contributes from round 2"
    assert all(res.coordinator != slow.peer_id for res in results)
    assert not planned_by(net, slow)


@pytest.mark.parametrize("word", [True, 0, -1, 3, 10**18, "1", 1.0, [1], None])
async def test_a_turn_given_up_for_no_round_of_the_job_is_ignored(autojump_clock, tmp_path, word) -> None:
    net = FakeNet(tmp_path, 2, fast_spec(rounds=2))
    here, peer = net.node(0), net.node(1)
    net._make(here)
    here.driver.saw_presence(peer.peer_id, JobPresence.from_wire(0, passes=word))
    assert here.driver.book.passing == {}
    here.driver.saw_presence(peer.peer_id, JobPresence.from_wire(0, passes=2))
    assert here.driver.book.passing == {peer.peer_id: 2}


async def test_what_a_peer_said_is_forgotten_with_its_presence(autojump_clock, tmp_path, monkeypatch) -> None:
    import gpuflex.node.state as state

    monkeypatch.setattr(state, "MAX_PRESENCE", 2)
    net = FakeNet(tmp_path, 4, fast_spec(rounds=2))
    here = net.node(0)
    net._make(here)
    book = here.driver.book
    for node in (net.node(1), net.node(2), net.node(3)):
        here.driver.saw_presence(node.peer_id, JobPresence.from_wire(0, rate=10.0, passes=1))
    kept = {net.node(2).peer_id, net.node(3).peer_id}
    assert set(book.presence) == kept
    assert set(book.rates) == set(book.passing) == book.ready_peers == kept


def test_a_job_is_old_by_the_deadline_clock_not_the_machines() -> None:
    """Whether a job was published long enough ago to catch its ledger up first reads the
    node's deadline clock. Read off the machine's clock, a simulated job looked old to the
    nodes it reached many real seconds after it was made, and one node in ten at 300 and 1,000
    simulated nodes caught up for 8 s before round 1 (its plan 8.5–9 s late)."""
    from types import SimpleNamespace
    from typing import Any, cast

    from gpuflex.node.clock import DeadlineClock
    from gpuflex.node.core.messages import JOB
    from gpuflex.node.prepare import CATCH_UP_FIRST_AFTER_S, Preparation
    from mesh.codec import seal
    from mesh.identity import Identity

    made = 1_000.0  # a modelled wall clock, far from the machine's
    frame = seal(Identity(bytes([9]) * 32), JOB, {"spec": {}, "members": [], "created": made})
    now = [made + CATCH_UP_FIRST_AFTER_S - 1]
    port = SimpleNamespace(clock=DeadlineClock(wall=lambda: now[0]))
    book = SimpleNamespace(info=SimpleNamespace(frame=frame))
    prep = Preparation(cast(Any, port), cast(Any, book), cast(Any, None), cast(Any, None))
    assert not prep._long_running()
    now[0] = made + CATCH_UP_FIRST_AFTER_S + 1
    assert prep._long_running()
