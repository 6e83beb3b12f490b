"""Liveness of the round loop, under trio's MockClock: a job none of whose members is
reachable waits for a change and says so; it never spins.

A spin here has no checkpoint at all (the loop returns without awaiting), so nothing in trio
could interrupt it: each test counts the coordinator's passes instead, and a counter that
runs away raises out of the job after a few hundred, which the assertions then report."""

from __future__ import annotations

import pytest
import trio

from gpuflex.node.roles.coordinator import Coordinator
from tests.unit.node.fakenet import FakeNet, fast_spec

pytestmark = pytest.mark.timeout(20)
RUNAWAY = 500  # passes after which a counted loop is stopped as a spin


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times each node's coordinator was asked for a plan (by peer id)."""
    counts: dict[str, int] = {}
    original = Coordinator.obtain_plan

    async def counted(self: Coordinator, rs: object) -> object:
        me = self.book.me
        counts[me] = counts.get(me, 0) + 1
        if counts[me] > RUNAWAY:
            raise AssertionError(f"the round loop of {me[-8:]} spun: {counts[me]} passes")
        return await original(self, rs)  # type: ignore[arg-type]

    monkeypatch.setattr(Coordinator, "obtain_plan", counted)
    return counts


async def test_a_job_whose_only_member_never_appears_waits_without_spinning(autojump_clock, tmp_path,
                                                                            passes) -> None:
    net = FakeNet(tmp_path, 2, fast_spec(rounds=2), initial=1)  # the job names node 0 alone
    absent, node = net.node(0), net.node(1)
    async with trio.open_nursery() as nursery:
        await net.start(nursery, count=0)  # node 0 never runs: its health stays unknown
        await net.join(node)
        await trio.sleep(600)
        summary = node.driver.summary()
        nursery.cancel_scope.cancel()
    assert summary["state"] == "running", summary["error"]
    assert "all 1 members of this job are gone" in summary["waiting"]
    # One pass when it starts, then one each time it looks again (every 60 mock seconds).
    assert passes[node.peer_id] <= 15, passes
    assert absent.peer_id not in passes


async def test_a_follower_waits_while_every_member_is_gone_then_catches_up(autojump_clock, tmp_path,
                                                                           passes) -> None:
    """No attacker: node 2 follows a job only nodes 0 and 1 may train (its allowlist), and is
    cut off from both. It waits at no cost, says why, and catches up once they are back."""
    ids = [FakeNet(tmp_path / "ids", 3, fast_spec()).node(i).peer_id for i in range(3)]
    net = FakeNet(tmp_path, 3, fast_spec(rounds=4, allowlist=ids[:2]))
    follower = net.node(2)
    for n in net.nodes.values():
        n.train_s = 3.0
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(1)
        net.split([0, 1], [2])
        await net.wait_rounds(3, nodes=[net.node(0)])
        before = passes[follower.peer_id]
        await trio.sleep(300)
        waiting = follower.driver.summary()["waiting"]
        during = passes[follower.peer_id] - before
        net.heal()
        await net.wait_rounds(4)
        nursery.cancel_scope.cancel()
    assert "all 2 members of this job are gone" in waiting
    assert during <= 8, f"{during} passes in 300 mock seconds while every member was gone"
    assert net.ledger(follower) == net.ledger(net.node(0))
    assert follower.driver.summary()["state"] == "done"
