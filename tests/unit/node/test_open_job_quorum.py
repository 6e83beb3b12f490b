"""The recent-contributors quorum of an open job, on the fake transport under MockClock: a side
that holds half of the recent contributors commits nothing and says why, whatever min_nodes
allows; once the network heals, every node commits on one ledger. An allowlisted job has no
such quorum: its min_nodes alone decides."""

from __future__ import annotations

import pytest
import trio

from tests.unit.node.fakenet import FakeNet, fast_spec
from tests.unit.node.test_round_protocol import contributors, one_ledger

pytestmark = pytest.mark.timeout(20)
#: Mock seconds a cut side is given to commit (many plan and round timeouts).
CUT_S = 120.0


def split_in_half(allowlisted: bool, tmp_path) -> FakeNet:
    spec = fast_spec(rounds=4, min_nodes=2)
    net = FakeNet(tmp_path, 4, spec)
    if allowlisted:
        net = FakeNet(tmp_path, 4, fast_spec(rounds=4, min_nodes=2, allowlist=net.ids()))
    for n in net.nodes.values():
        n.train_s = 2.0  # round 2 is still training when the network is cut
    return net


async def run_cut(net: FakeNet, *, finish: bool) -> tuple[int, list[str]]:
    """Round 1 with every node, then a cut into two halves for ``CUT_S``: (rounds the first half
    committed meanwhile, its waiting notes); then, with ``finish``, heal and finish the job."""
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(1)
        net.split([0, 1], [2, 3])
        await trio.sleep(CUT_S)
        half = [net.node(0), net.node(1)]
        for n in half:
            n.driver.check_quorum()  # what JobManager's quorum loop does every few seconds
        committed = min(n.driver.committed for n in half)
        notes = [n.driver.summary()["waiting"] for n in half]
        if finish:
            net.heal()
            await net.wait_rounds(4)
            await net.wait_until(lambda: len({tuple(net.ledger(n)) for n in net.alive_nodes()}) == 1, limit=60)
        nursery.cancel_scope.cancel()
    return committed, notes


async def test_an_open_job_half_commits_nothing_and_says_why_then_all_agree(autojump_clock, tmp_path) -> None:
    net = split_in_half(False, tmp_path)
    committed, notes = await run_cut(net, finish=True)
    assert committed == 1, "two of the four recent contributors are not most of them"
    assert all("only 2 of the 3 recent contributors an open job needs are reachable" in n for n in notes), notes
    results = one_ledger(net, 4)
    assert all(len(contributors(r)) >= 3 for r in results)


async def test_an_allowlisted_job_half_commits_with_min_nodes(autojump_clock, tmp_path) -> None:
    net = split_in_half(True, tmp_path)
    committed, notes = await run_cut(net, finish=False)  # each half may finish the job on its own
    assert committed >= 2 and not any(notes), "an allowlisted job needs only min_nodes"
