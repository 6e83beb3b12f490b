"""Training ahead while an update travels (job option ``overlap``): on the fake transport under
MockClock with the real drivers and roles, and the head start's own rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import trio

from gpuflex.jobspec import JobSpec, JobSpecError
from gpuflex.node.ahead import GAP_SHARE, Ahead, HeadStart, merged_metrics
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.ledger import verify_chain
from tests.unit.node.fakenet import FakeNet, FakeNode, fast_spec

pytestmark = pytest.mark.timeout(60)
BUDGET_S = 6.0
RATE = 320.0  # samples per mock second: ten steps a second


def round_lengths(node: FakeNode) -> dict[int, float]:
    planned = {e.round: e.at for e in node.events if e.kind == EventKind.PLAN_RECEIVED}
    return {e.round: e.at - planned[e.round] for e in node.events if e.kind == EventKind.ROUND_COMMITTED}


def late_round_s(net: FakeNet) -> float:
    """The mean time from plan to commit from round 3 on, over every node and so over the same
    mix of roles each round."""
    return float(np.mean([t for node in net.alive_nodes() for r, t in round_lengths(node).items() if r >= 3]))


#: Mock seconds every message takes: a slow uplink, so updates and results travel a while.
LINK_S = 1.5


async def run_budgeted(tmp_path, overlap: float, rounds: int = 5):
    net = FakeNet(tmp_path, 4, fast_spec(rounds=rounds, min_nodes=4, compute_budget_s=BUDGET_S,
                                         train_timeout_s=0.0, plan_timeout_s=10.0, reduce_timeout_s=8.0,
                                         overlap=overlap),
                  jitter=lambda a, b: LINK_S)
    for node in net.nodes.values():
        node.rate = RATE
    results = await net.run_rounds(rounds)
    assert [r.round for r in results] == list(range(1, rounds + 1))
    return net, results


async def test_members_train_ahead_and_every_round_commits_with_everyone_on_one_ledger(autojump_clock,
                                                                                       tmp_path) -> None:
    _, results = await run_budgeted(tmp_path / "on", overlap=0.5)
    assert all(len(r.contributors) == 4 for r in results), "no update is lost to training ahead"
    ahead_rows = [(r.round, c) for r in results for c in r.contributors if c.get("ahead_steps")]
    # Round 1 learns the wait, round 2's members train ahead for round 3 on. A member trains
    # ahead once it has measured its wait in that role: as a member from round 3, as the
    # round's root (after its commit) from the second round it roots.
    assert {rnd for rnd, _ in ahead_rows} == set(range(3, len(results) + 1))
    for before, r in itertools.pairwise(results[2:]):
        ahead = {c["peer"] for c in r.contributors if c.get("ahead_steps")}
        assert {c["peer"] for c in r.contributors} - {before.coordinator} <= ahead
    assert all(0 < c["ahead_steps"] < c["steps"] for _, c in ahead_rows)


async def test_a_budgeted_round_holds_more_steps_in_the_same_time_with_a_head_start(autojump_clock,
                                                                                   tmp_path) -> None:
    """Under a compute budget a round lasts its budget either way: the steps trained while the
    update travelled are extra work in the same wall time, which is what utilisation counts."""
    on, with_ahead = await run_budgeted(tmp_path / "on", overlap=0.5)
    off, without = await run_budgeted(tmp_path / "off", overlap=0.0)
    steps_on = [c["steps"] for r in with_ahead[2:] for c in r.contributors]
    steps_off = [c["steps"] for r in without[2:] for c in r.contributors]
    assert np.mean(steps_on) > 1.5 * np.mean(steps_off), (steps_on, steps_off)
    # Over every node, not one: a node's round lasts 1.5 s longer in the rounds it roots than
    # in those it is a member of, and which rounds those are follows the random peer ids.
    assert late_round_s(on) < late_round_s(off) + 1.0, (late_round_s(on), late_round_s(off))


class LineTrainer:
    """Moves every parameter by 1 per step: where a head start began shows in its delta."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[int, float]] = []

    def train(self, base, max_steps=0, time_limit_s=0.0):
        self.calls.append((max_steps, time_limit_s))
        if self.fail:
            raise RuntimeError("plug-in broke")
        return np.full_like(base, float(max_steps)), {"steps": max_steps, "samples": 2 * max_steps,
                                                       "seconds": 0.5}


class Port:
    async def offload(self, fn, *args):
        return fn(*args)


async def test_a_head_start_waits_for_a_known_gap_and_is_taken_only_by_its_round() -> None:
    head = HeadStart(0.5)
    trainer = LineTrainer()
    start = np.zeros(3, dtype=np.float32)
    await head.run(Port(), trainer, start, 2, 10)  # type: ignore[arg-type]
    assert trainer.calls == [], "no head start before the gap to the next plan is known"
    head.ready(10.0)
    head.plan_arrived(14.0)
    assert head.gap_s() == 4.0 and head.gap_s(as_root=True) == 0.0
    await head.run(Port(), trainer, start, 3, 10)  # type: ignore[arg-type]
    assert trainer.calls == [(5, GAP_SHARE * 4.0)]
    assert await head.take(4, 10) is None, "a head start for round 3 is not round 4's"
    await head.run(Port(), trainer, start, 3, 10)  # type: ignore[arg-type]
    ahead = await head.take(3, 10)
    assert ahead is not None and ahead.steps == 5 and np.all(ahead.delta == 5.0)
    assert await head.take(3, 10) is None, "taken once"
    await head.run(Port(), trainer, start, 3, 10)  # type: ignore[arg-type]
    assert await head.take(3, 5) is None, "the plan now allows no more steps than were taken ahead"


async def test_a_failed_head_start_leaves_the_round_to_train_in_full() -> None:
    head = HeadStart(0.9)
    head.gaps[False] = 2.0
    await head.run(Port(), LineTrainer(fail=True), np.zeros(2, dtype=np.float32), 2, 10)  # type: ignore[arg-type]
    assert await head.take(2, 10) is None


def test_steps_ahead_leave_at_least_one_for_the_plan() -> None:
    assert HeadStart(0.9).steps_for(2) == 1 and HeadStart(0.9).steps_for(1) == 0
    assert HeadStart(0.25).steps_for(40) == 10


def test_merged_metrics_add_the_work_and_say_what_came_ahead() -> None:
    ahead = Ahead(3, metrics={"steps": 4, "samples": 128, "seconds": 1.0, "train_loss": 9.0})
    out = merged_metrics(ahead, {"steps": 6, "samples": 192, "seconds": 1.0, "train_loss": 2.0})
    assert out["steps"] == 10 and out["samples"] == 320 and out["seconds"] == 2.0
    assert out["samples_per_s"] == 160.0 and out["train_loss"] == 2.0
    assert out["ahead_steps"] == 4 and out["ahead_seconds"] == 1.0


@pytest.mark.parametrize(("fields", "says"), [
    ({"local_epochs": 1}, "needs local_steps or compute_budget_s"),
    ({"local_steps": 10, "train_fn": "mylab.loops:train"}, "train_fn"),
    ({"local_steps": 10, "drift_correction": "scaffold", "normalization": "none"}, "scaffold"),
    ({"local_steps": 10, "overlap": 0.95}, "≤ 0.9"),
])
def test_the_job_file_refuses_what_overlap_cannot_work_with(fields, says) -> None:
    with pytest.raises(JobSpecError, match=says):
        JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "overlap": 0.5, **fields})


def test_a_job_with_local_steps_may_train_ahead() -> None:
    assert JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "local_steps": 20,
                              "overlap": 0.5}).overlap == 0.5


async def test_a_member_killed_while_training_ahead_loses_no_one_elses_update(autojump_clock, tmp_path) -> None:
    """A member dies in the middle of its head start: the rounds go on without it, on one
    ledger, and every survivor's update is in every round after."""
    net = FakeNet(tmp_path, 4, fast_spec(rounds=6, min_nodes=3, compute_budget_s=BUDGET_S, train_timeout_s=0.0,
                                         plan_timeout_s=10.0, reduce_timeout_s=8.0, overlap=0.5),
                  jitter=lambda a, b: LINK_S)
    for node in net.nodes.values():
        node.rate = RATE
    victim = net.ranking()[-1]
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(3)
        head = victim.driver.member.head_start
        await net.wait_until(lambda: head._ahead is not None and not head._ahead.done.is_set())
        killed_in = victim.driver.committed + 1
        net.kill(victim)
        await net.wait_rounds(6)
        nursery.cancel_scope.cancel()
    nodes = net.alive_nodes()
    frames = [net.ledger(n) for n in nodes]
    assert all(f == frames[0] for f in frames), "ledgers differ between nodes"
    results = verify_chain(frames[0], net.info.job_id)
    assert [r.round for r in results] == list(range(1, 7))
    survivors = {n.peer_id for n in nodes}
    for r in results[killed_in - 1:]:  # the round it died in and every round after
        assert survivors <= {c["peer"] for c in r.contributors}, f"a survivor's update is missing in round {r.round}"
    assert all(victim.peer_id not in {c["peer"] for c in r.contributors} for r in results[killed_in:])
