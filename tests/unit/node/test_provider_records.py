"""Who announces a committed model in the DHT: the round's root alone.

Every member holds the committed model, but members fetch it down the round's tree from
peers they are told of, never by lookup; a provider record from each of them cost a DHT walk
and k stores per member per round (O(members × k) streams a round) for nothing the node
reads. On the fake transport under MockClock, with the real drivers and roles."""

from __future__ import annotations

import pytest
import trio

from gpuflex.node.core.ledger import verify_chain
from tests.unit.node.fakenet import FakeNet, fast_spec

pytestmark = pytest.mark.timeout(60)
ROUNDS = 3


async def test_each_committed_model_is_announced_once_by_its_root(autojump_clock, tmp_path) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=ROUNDS, min_nodes=4))
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(ROUNDS)
        await trio.sleep(5)  # announcements run in the background after the commit
        nursery.cancel_scope.cancel()
    results = verify_chain(net.ledger(net.alive_nodes()[0]), net.info.job_id)
    assert [r.round for r in results] == list(range(1, ROUNDS + 1))
    assert sorted(net.announced) == sorted((r.model_hash, r.coordinator) for r in results)
