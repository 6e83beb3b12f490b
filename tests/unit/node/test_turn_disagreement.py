"""Two honest nodes that disagree about whose turn it is converge, and no such race fails a job.

Health is each node's own view: a node whose record of a peer is stale (it saw the peer as
down a moment too long) skips that peer's attempt and coordinates its own next turn, while
the others wait for the peer's plan. The plan then reaches it too, and it goes back to the
attempt its peers are in. Its own turn, still waiting for enough members, must then give way:
planning the attempt it went back to in its own name made a plan its own check refused, and
the exception ended the whole job on that node.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from gpuflex.errors import GpuflexError
from gpuflex.node.core.kinds import EventKind, JobState
from mesh.health import PeerState
from tests.unit.node.fakenet import PRESENCE_EVERY_S, FakeNet, FakePort, FakeTrainer, fast_spec
from tests.unit.node.test_round_protocol import contributors, one_ledger

pytestmark = pytest.mark.timeout(10)
#: Until this mock time the stale node sees attempt 0's coordinator as down.
STALE_UNTIL = 1.0
#: Mock seconds a test lets the round run after a node's job failed.
SETTLE_S = 90.0


async def test_a_node_that_skipped_a_live_turn_converges_and_its_job_does_not_fail(
        autojump_clock, tmp_path, monkeypatch) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=2, min_nodes=4))  # every node's update is needed
    first, stale = net.ranking(1, 0)[0], net.ranking(1, 1)[0]  # ``stale`` owns attempt 1
    for node in net.nodes.values():
        node.train_s = 3.0  # attempt 0 is still training when the stale view clears
    honest = FakePort.health

    def health(port: FakePort, peer: str) -> PeerState | None:
        if port.node is stale and peer == first.peer_id and trio.current_time() < STALE_UNTIL:
            return PeerState.DOWN
        return honest(port, peer)

    monkeypatch.setattr(FakePort, "health", health)

    async def clear_the_stale_view() -> None:
        await trio.sleep(STALE_UNTIL)
        net._health_changed()  # the stale node's record of ``first`` is up again

    async with trio.open_nursery() as nursery:
        nursery.start_soon(clear_the_stale_view)
        await net.start(nursery)
        await net.wait_rounds(2, limit=120)
        results = one_ledger(net, 2)
        nursery.cancel_scope.cancel()
    failed = [(n.index, e.message) for n in net.nodes.values() for e in n.events if e.kind == EventKind.JOB_FAILED]
    assert not failed, f"a turn disagreement failed a job: {failed}\n{net.dump()}"
    assert all(n.driver.book.status.state == JobState.DONE for n in net.nodes.values())
    took = [e for e in stale.events if e.kind == EventKind.PLAN_RECEIVED and " for attempt 0 " in e.message]
    assert took, "the stale node went back to attempt 0, which its peers were in"
    assert results[0].attempt == 0 and results[0].coordinator == first.peer_id, \
        "round 1 committed in the attempt its peers agreed on, within its deadline"
    assert contributors(results[0]) == set(net.order)


async def test_a_job_that_fails_on_one_node_says_why_there_and_its_peers_name_it_as_gone(
        autojump_clock, tmp_path, monkeypatch) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=2, min_nodes=4))
    broken = net.ranking(1, 0)[-1]  # a plain member of round 1's first plan
    why = "the model needs 9 GiB and this device has 4"
    fitted = FakeTrainer.fitted

    def fit(trainer: FakeTrainer) -> dict[str, Any]:
        if trainer.node is broken:
            raise GpuflexError(why)  # a reason the job itself makes impossible on this node
        return fitted(trainer)

    monkeypatch.setattr(FakeTrainer, "fitted", fit)
    others = [n for n in net.nodes.values() if n is not broken]

    async def quorum_checks() -> None:  # what JobManager's quorum loop does on each node
        while True:
            for n in others:
                n.driver.check_quorum()
            await trio.sleep(2.0)

    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        nursery.start_soon(quorum_checks)
        await net.wait_until(lambda: broken.driver.state == JobState.FAILED, limit=30)
        assert why in broken.driver.summary()["error"], "job status on the node says why the job failed"
        # Long enough for round 1's first attempt (planned before the failure was known) to
        # time out and be retried, as it was over and over when peers did not know.
        await trio.sleep(SETTLE_S)
        nursery.cancel_scope.cancel()
    for n in others:
        waiting = n.driver.summary()["waiting"]
        assert f"{broken.peer_id[-8:]} is gone: the job failed there ({why})" in waiting, waiting
    retried = [(n.index, e.message) for n in others for e in n.events
               if e.kind == EventKind.PLAN_RECEIVED and e.at > PRESENCE_EVERY_S + 1.0]
    assert not retried, f"a plan named the member whose job failed, and was retried in silence: {retried}"


async def test_a_failed_jobs_reason_reaches_its_peers_without_the_local_paths_it_quotes(
        autojump_clock, tmp_path, monkeypatch) -> None:
    net = FakeNet(tmp_path, 3, fast_spec(rounds=2, min_nodes=3))
    broken = net.ranking(1, 0)[-1]
    where = "/home/alice/datasets/clinic-7/x.npz"  # the operator's user and directories
    fitted = FakeTrainer.fitted

    def fit(trainer: FakeTrainer) -> dict[str, Any]:
        if trainer.node is broken:
            raise FileNotFoundError(2, "No such file or directory", where)
        return fitted(trainer)

    monkeypatch.setattr(FakeTrainer, "fitted", fit)
    others = [n for n in net.nodes.values() if n is not broken]
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_until(lambda: all(broken.peer_id in n.driver.book.left for n in others), limit=30)
        nursery.cancel_scope.cancel()
    assert where in broken.driver.summary()["error"], "job status on the node itself keeps the path"
    for n in others:
        (gone,) = n.driver.summary()["gone"]
        assert gone == {"peer": broken.peer_id, "reason": "[Errno 2] No such file or directory: '<path>'"}
