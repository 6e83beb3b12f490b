"""A member that missed rounds of a sparse-codec job replays the steps it missed instead of
downloading the model, while they cost less than the model, and ends on the mesh's exact model."""

from __future__ import annotations

import trio

from gpuflex.jobspec import JobSpec
from tests.unit.node import fakenet
from tests.unit.node.fakenet import FakeNet, FakeNode, fast_spec


async def _cut_off_after_round_1(net: FakeNet, nursery: trio.Nursery, straggler: FakeNode) -> None:
    """Start ``net``; once ``straggler`` holds round 1, cut it off until the others hold round 3."""
    for n in net.nodes.values():
        n.train_s = 2.0
    await net.start(nursery)
    await net.wait_until(lambda: straggler.driver is not None and straggler.driver.book.committed == 1)
    alone = net.order.index(straggler.peer_id)
    net.split([i for i in range(len(net.order)) if i != alone], [alone])
    await net.wait_rounds(3, [n for n in net.nodes.values() if n is not straggler])


async def _miss_two_rounds_and_catch_up(tmp_path, spec: JobSpec) -> int:
    """Cut one of four nodes off after round 1, let the others finish round 3, then hand it
    their ledger. Returns how many steps it replayed while catching up."""
    net = FakeNet(tmp_path, 4, spec)
    straggler = net.node(3)
    async with trio.open_nursery() as nursery:
        await _cut_off_after_round_1(net, nursery, straggler)
        book = straggler.driver.book
        assert book.committed == 1
        before = book.status.steps_replayed
        net.heal()
        assert await straggler.driver.offer_ledger(net.ledger(net.node(0)), net.node(0).peer_id)
        nursery.cancel_scope.cancel()
    assert book.committed == 3
    assert book.head_model == net.node(0).driver.book.head_model and straggler.blobs.has(book.head_model)
    return book.status.steps_replayed - before


async def test_a_member_rounds_behind_replays_the_missed_sparse_steps(autojump_clock, tmp_path,
                                                                     monkeypatch) -> None:
    # A model large enough that two steps cost less than the model (with 6 parameters the
    # steps' headers alone outweigh it, and downloading it is the cheaper way).
    monkeypatch.setattr(fakenet, "DIM", 20_000)
    spec = fast_spec(rounds=3, min_nodes=2, strategy="diloco", server_lr=1.0, server_momentum=0.9,
                     codec="sparse", sparse_chunk=256, sparse_density=1 / 64)
    replayed = await _miss_two_rounds_and_catch_up(tmp_path, spec)
    assert replayed == 2, "both missed steps were replayed"


async def test_a_member_downloads_the_model_when_the_missed_steps_cost_more(autojump_clock, tmp_path) -> None:
    spec = fast_spec(rounds=3, min_nodes=2, strategy="diloco", server_lr=1.0, server_momentum=0.9,
                     codec="sparse", sparse_chunk=16, sparse_density=0.5)  # 6 parameters: steps cost more
    replayed = await _miss_two_rounds_and_catch_up(tmp_path, spec)
    assert replayed == 0


async def test_a_member_rounds_behind_replays_the_missed_fragment_steps(autojump_clock, tmp_path,
                                                                       monkeypatch) -> None:
    """fragments = 4: each missed round's step is one fragment's, replayed on that fragment."""
    monkeypatch.setattr(fakenet, "DIM", 20_000)
    spec = fast_spec(rounds=3, min_nodes=2, strategy="diloco", server_lr=0.7, server_momentum=0.9,
                     codec="int8", fragments=4)
    replayed = await _miss_two_rounds_and_catch_up(tmp_path, spec)
    assert replayed == 2, "both missed fragment steps were replayed"


async def test_a_catch_up_that_resumed_after_our_rounds_is_adopted_and_a_false_held_prefix_is_not(
        autojump_clock, tmp_path) -> None:
    """``offer_ledger(frames, peer, held)`` as sync calls it: our first round as a view of our
    file, then the peer's rounds after it, is adopted. A chain whose first round is not ours,
    offered as if it were (``held`` = 1), changes nothing: the round at ``held`` does not have
    our digest, so it is compared from round 1, and the rounds after it do not verify."""
    from gpuflex.node.core.ledgerfile import ChainFrames
    from tests.unit.node.chain import make_chain

    net = FakeNet(tmp_path, 4, fast_spec(rounds=3, min_nodes=2))
    straggler = net.node(3)
    async with trio.open_nursery() as nursery:
        await _cut_off_after_round_1(net, nursery, straggler)
        book = straggler.driver.book
        theirs = net.ledger(net.node(0))
        # Another job's round 1 in place of ours, with the rest of theirs: not ours, so not taken as read.
        foreign = ChainFrames(make_chain(rounds=1)[0], 1, theirs[1:])
        assert not await straggler.driver.offer_ledger(foreign, net.node(0).peer_id, 1)
        assert book.committed == 1
        net.heal()
        assert await straggler.driver.offer_ledger(ChainFrames(book.ledger.frames, 1, theirs[1:]),
                                                   net.node(0).peer_id, 1)
        nursery.cancel_scope.cancel()
    assert book.committed == 3 and list(book.ledger.frames) == theirs
