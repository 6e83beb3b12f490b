"""Time-budgeted rounds on the fake transport under MockClock: a member twenty times slower
than the others still contributes every round, and the round lasts as long as the budget."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.ledger import verify_chain
from gpuflex.node.core.ranking import coordinator_ranking
from gpuflex.node.core.workplan import STEP_HEADROOM
from tests.unit.node.fakenet import BATCH, FakeNet, FakeNode, fast_spec

pytestmark = pytest.mark.timeout(20)
BUDGET_S = 10.0
FAST, SLOW = 320.0, 16.0  # samples per mock second: 10 steps a second against one every two seconds
#: The fake mesh's own time per round: messages (10 ms each), a plan, a commit.
OVERHEAD_S = 1.0


def round_lengths(node: FakeNode) -> dict[int, float]:
    """Mock seconds from each round's plan to its commit, as this node saw them."""
    planned = {e.round: e.at for e in node.events if e.kind == EventKind.PLAN_RECEIVED}
    return {e.round: e.at - planned[e.round] for e in node.events if e.kind == EventKind.ROUND_COMMITTED}


def speeds(net: FakeNet, slow: int) -> None:
    for node in net.nodes.values():
        node.rate = SLOW if node.index == slow else FAST


async def test_a_slow_member_contributes_within_the_budget(autojump_clock, tmp_path) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=3, min_nodes=4, compute_budget_s=BUDGET_S, train_timeout_s=0.0,
                                         group_size=2))
    # The slow member is the one whose turn round 2 is (after round 1's coordinator, cooling).
    first = net.ranking(1)[0].peer_id
    slow = coordinator_ranking(net.info.job_id, 2, net.info.initial_members, [first])[0]
    speeds(net, slow=net.nodes[slow].index)
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(3)
        node = net.alive_nodes()[0]
        frames = net.ledger(node)
        assert all(net.ledger(n) == frames for n in net.alive_nodes())
        results = verify_chain(frames, net.info.job_id)
        lengths = round_lengths(node)
        for r in range(1, 4):  # FedNova, flat, equals what the tree committed
            np.testing.assert_allclose(net.committed_model(node, r), net.expected_model(node, r), atol=1e-5)
        nursery.cancel_scope.cancel()
    for res in results:
        work = {c["peer"]: c for c in res.contributors}
        assert set(work) == set(net.ids()), f"round {res.round}: every member contributes, the slow one too"
        assert lengths[res.round] <= BUDGET_S + OVERHEAD_S, f"round {res.round} outlasted its budget"
        assert all(0 < c["compute_s"] <= BUDGET_S for c in work.values())
        fast = [c for p, c in work.items() if p != slow]
        assert work[slow]["steps"] < min(c["steps"] for c in fast), "the slow member does fewer steps"
        assert work[slow]["steps"] * BATCH / SLOW <= BUDGET_S
        assert all(c["steps"] * BATCH / FAST >= 0.9 * BUDGET_S for c in fast), "fast members fill the budget"
        assert sum(c["compute_share"] for c in work.values()) == pytest.approx(1.0, abs=1e-3)
        assert work[slow]["device"] == f"fake{net.nodes[slow].index}"
    # From round 2 on, every plan has every member's measured throughput (presence).
    from gpuflex.node.core.messages import PLAN, parse_plan
    from mesh.codec import open_envelope

    later = parse_plan(open_envelope(results[-1].plan_frame, expect_kind=PLAN))
    assert later.budget_s == BUDGET_S
    assert later.steps[slow] == int(BUDGET_S * STEP_HEADROOM * SLOW // BATCH)
    for res in results:
        plan = parse_plan(open_envelope(res.plan_frame, expect_kind=PLAN))
        if plan.steps.get(slow) != later.steps[slow]:
            continue  # nobody's throughput was known yet when it was planned
        assert slow not in plan.parent.values(), f"round {res.round}: the slow member leads a group"
    # Round 2 was the slow member's turn. Round 1's result recorded the throughputs, so every
    # node passed that attempt at once, and the next in the ranking coordinated.
    assert results[0].coordinator == first
    assert results[1].coordinator != slow and results[1].attempt == 1
    assert all(res.coordinator != slow for res in results[1:])


async def test_without_a_budget_the_slow_member_sets_the_rounds_length(autojump_clock, tmp_path) -> None:
    """The same mesh with fixed local work (the default): every round waits for the slow member."""
    net = FakeNet(tmp_path, 4, fast_spec(rounds=2, train_timeout_s=60.0))
    speeds(net, slow=3)
    for node in net.nodes.values():
        node.train_s = 2 * BUDGET_S if node.index == 3 else 1.0
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(2)
        lengths = round_lengths(net.alive_nodes()[0])
        nursery.cancel_scope.cancel()
    assert len(lengths) == 2 and all(t >= 2 * BUDGET_S for t in lengths.values())


async def test_a_retried_attempt_keeps_the_step_counts_members_already_trained(autojump_clock, tmp_path) -> None:
    """The coordinator dies after its plan; by the retry every member has published a lower
    throughput. The new plan must still allow the steps each member already took, so the
    updates they trained are re-sent, not refused as over-claimed or trained again."""
    # A short budget: members finish training before the coordinator's death is noticed.
    net = FakeNet(tmp_path, 4, fast_spec(rounds=1, compute_budget_s=2.0, train_timeout_s=0.0))
    speeds(net, slow=3)
    coordinator = net.ranking()[0]
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_until(lambda: all(n.driver is not None and n.driver.book.current.plan is not None
                                          for n in net.nodes.values()))
        for node in net.alive_nodes():  # slower measurements arrive (a busy machine)
            assert node.driver is not None
            node.driver.book.rates = {p: r / 4 for p, r in node.driver.book.rates.items()}
        net.kill(coordinator)
        await net.wait_rounds(1)
        node = net.alive_nodes()[0]
        (res,) = verify_chain(net.ledger(node), net.info.job_id)
        nursery.cancel_scope.cancel()
    assert res.attempt >= 1 and len(res.contributors) == 3
    for n in net.alive_nodes():
        assert n.kinds().count(EventKind.TRAINED) == 1, "the retry re-sent the update trained for attempt 0"
        assert not n.penalties, f"an update was refused: {n.penalties}"


async def test_a_retry_that_arrives_mid_training_waits_for_that_training(autojump_clock, tmp_path) -> None:
    """A ten-second budget: the coordinator's death is noticed while members still train for
    attempt 0. The retry re-sends what they were training rather than training it twice."""
    net = FakeNet(tmp_path, 4, fast_spec(rounds=1, compute_budget_s=BUDGET_S, train_timeout_s=0.0))
    speeds(net, slow=3)
    coordinator = net.ranking()[0]
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_until(lambda: all(n.driver is not None and n.driver.book.current.plan is not None
                                          for n in net.nodes.values()))
        net.kill(coordinator)
        await net.wait_rounds(1)
        (res,) = verify_chain(net.ledger(net.alive_nodes()[0]), net.info.job_id)
        nursery.cancel_scope.cancel()
    assert res.attempt >= 1 and len(res.contributors) == 3
    for n in net.alive_nodes():
        kinds = n.kinds()
        assert kinds.index(EventKind.ROUND_RETRIED) < kinds.index(EventKind.TRAINED), "the retry came mid-training"
        assert kinds.count(EventKind.TRAINED) == 1


async def test_a_plan_whose_budget_or_step_counts_are_not_the_jobs_is_refused(autojump_clock, tmp_path) -> None:
    from gpuflex.node.core.messages import make_plan, parse_plan
    from mesh.codec import WireError, open_envelope

    net = FakeNet(tmp_path, 3, fast_spec(rounds=1, compute_budget_s=BUDGET_S, local_steps=50, train_timeout_s=0.0))
    speeds(net, slow=2)
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        driver = net.node(0).driver
        assert driver is not None
        book = driver.book
        await book.ready.wait()
        owner = book.expected_coordinator(0)
        assert owner is not None
        signer = next(n.identity for n in net.nodes.values() if n.peer_id == owner)
        members = [owner, *(p for p in net.ids() if p != owner)]

        def plan(**work: object):
            return parse_plan(open_envelope(make_plan(
                signer, job=net.info.job_id, round=1, attempt=0, coordinator=owner, base_hash=book.head_model,
                prev_result="", members=members, parent={p: None if p == owner else owner for p in members},
                train_deadline=1.0, reduce_slack_s=1.0, sample_cap=0, **work)))

        driver.coordinator._check(plan(budget_s=BUDGET_S, steps=dict.fromkeys(members, 50)))  # the job's own
        for forged in ({"budget_s": 10 * BUDGET_S, "steps": dict.fromkeys(members, 50)},  # a longer budget
                       {},  # no budget in a budgeted job: each member's epochs would decide
                       {"budget_s": BUDGET_S, "steps": dict.fromkeys(members, 51)}):  # past local_steps
            with pytest.raises(WireError, match="compute budget"):
                driver.coordinator._check(plan(**forged))
        nursery.cancel_scope.cancel()


async def run_with_a_lagging_leaf(tmp_path, rounds: int, outbound: bool, lag: float = 1.0, **spec: object
                                  ) -> tuple[FakeNode, dict[int, dict[str, float]], dict[int, float]]:
    """A budgeted mesh where every message from (``outbound``) or to one member takes ``lag``
    seconds more. The member is also slow, so that it is a leaf (a leader's late partial is the tree's
    latency, which no member's timing can hide), with steps short enough for its time stop to
    show. Returns it, each round's training seconds by peer, and each round's length."""
    net = FakeNet(tmp_path, 4, fast_spec(rounds=rounds, compute_budget_s=BUDGET_S, train_timeout_s=0.0, **spec))
    first = net.ranking(1)[0].peer_id
    lagging = next(n for n in net.nodes.values() if n.peer_id != first)
    speeds(net, slow=lagging.index)
    lagging.rate = FAST / 5
    plain_delay = net.delay
    net.delay = lambda a, b: plain_delay(a, b) + (lag if (a if outbound else b) is lagging else 0.0)  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(rounds)
        node = next(n for n in net.alive_nodes() if n is not lagging)
        results = verify_chain(net.ledger(node), net.info.job_id)
        lengths = round_lengths(node)
        nursery.cancel_scope.cancel()
    seconds = {res.round: {c["peer"]: c["compute_s"] for c in res.contributors} for res in results}
    return lagging, seconds, lengths


async def test_a_member_with_a_slow_uplink_stops_early_so_its_update_arrives_with_the_others(
        autojump_clock, tmp_path) -> None:
    """Every message from one member takes a second. Round 1 waits for its late update; from
    then on it knows its update takes a second to reach its leader, trains a second less, and
    the round ends one budget after the plan again."""
    laggard, seconds, lengths = await run_with_a_lagging_leaf(tmp_path, 3, outbound=True)
    assert all(laggard.peer_id in s for s in seconds.values()), "the laggard counts every round"
    assert seconds[1][laggard.peer_id] >= 0.9 * BUDGET_S  # it did not know yet
    for r in (2, 3):
        others = [s for p, s in seconds[r].items() if p != laggard.peer_id]
        assert seconds[r][laggard.peer_id] <= min(others) - 0.8, f"round {r}: {seconds[r]}"
        assert lengths[r] < lengths[1] - 0.5, lengths


async def test_a_member_that_has_not_published_its_throughput_is_not_planned(autojump_clock, tmp_path) -> None:
    """A member still loading its data (no throughput yet) is left out of the plan rather than
    planned blind; the others, enough for min_nodes, commit without it."""
    net = FakeNet(tmp_path, 4, fast_spec(rounds=2, min_nodes=3, compute_budget_s=BUDGET_S, train_timeout_s=0.0))
    first = net.ranking(1)[0].peer_id
    for node in net.nodes.values():
        node.rate = FAST
    unmeasured = next(n for n in net.nodes.values() if n.peer_id != first)
    unmeasured.rate = 0.0  # its device probe measured nothing: it publishes no throughput
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(2)
        node = next(n for n in net.alive_nodes() if n is not unmeasured)
        results = verify_chain(net.ledger(node), net.info.job_id)
        nursery.cancel_scope.cancel()
    from gpuflex.node.core.messages import PLAN, parse_plan
    from mesh.codec import open_envelope

    for res in results:
        plan = parse_plan(open_envelope(res.plan_frame, expect_kind=PLAN))
        if plan.coordinator == unmeasured.peer_id:
            continue  # its own plan includes itself
        assert unmeasured.peer_id not in plan.members, f"round {res.round} planned a member with no throughput"
        assert len(res.contributors) == 3


async def test_a_member_that_gets_the_plan_late_trains_that_much_less(autojump_clock, tmp_path) -> None:
    """Every message to one member takes a second: it takes each plan up a second after the
    others. Its budget still ends one budget after the plan was issued, so its update arrives
    with theirs from the first round on."""
    late, seconds, lengths = await run_with_a_lagging_leaf(tmp_path, 2, outbound=False)
    for r, by_peer in seconds.items():
        assert late.peer_id in by_peer, f"round {r}: the late member counts"
        assert by_peer[late.peer_id] <= BUDGET_S - 0.9, f"round {r}: {by_peer}"
        assert lengths[r] <= BUDGET_S + 0.5, lengths


async def test_a_member_that_gets_the_plan_most_of_a_budget_late_still_does_not_hold_the_round(
        autojump_clock, tmp_path) -> None:
    """Every message to one member takes 6 s of a 10 s budget: from round 2 it trains the 4 s
    left, and the round still ends about one budget after the plan (it used to train 7.5 s from taking the
    plan up and hold every round 3.5 s)."""
    # A plan timeout past the lag: the member waits for its peers' plans rather than running ahead.
    late, seconds, lengths = await run_with_a_lagging_leaf(tmp_path, 3, outbound=False, lag=6.0, plan_timeout_s=12.0)
    for r, by_peer in seconds.items():
        if r == 1:
            continue  # its peers' throughputs reach it 6 s late too: it may join at round 2
        assert late.peer_id in by_peer, f"round {r}: the late member counts"
        assert by_peer[late.peer_id] <= BUDGET_S - 5.9, f"round {r}: {by_peer}"
        assert lengths[r] <= BUDGET_S + 0.5, lengths
