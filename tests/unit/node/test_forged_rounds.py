"""Forged rounds against real drivers on the fake transport, under MockClock: by gossip, by
catch-up sync, and after the job is finished, the nodes keep one ledger with its evidence; a
branch that keys of one party commit alone, longer but lighter, replaces nothing, and a node
that holds one goes back to the heavier ledger."""

from __future__ import annotations

import contextlib

import pytest
import trio

from gpuflex.node.core.evidence import ChainRules
from gpuflex.node.core.forkchoice import chain_weight, result_key
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.ledger import (
    LedgerClaim,
    LedgerError,
    verify_chain,
)
from mesh.codec import WireError, open_envelope
from mesh.messaging import Inbound, Rejected
from tests.unit.node.chain import STRANGER, next_round, parsed, private_branch
from tests.unit.node.fakenet import FakeNet, FakeNode, fast_spec

pytestmark = pytest.mark.timeout(20)


async def gossip(net: FakeNet, frame: bytes, sender: str) -> None:
    """Deliver ``frame`` to every running node as gossip relayed by ``sender``."""
    env = open_envelope(frame)
    for node in net.alive_nodes():
        assert node.driver is not None
        with contextlib.suppress(Rejected, WireError):
            await node.driver.handle(Inbound(env, None, sender, gossip=True))


def rules(net: FakeNet) -> ChainRules:
    return ChainRules.for_job(net.info.job_id, net.spec, net.info.initial_members, net.info.submitted_by)


def rejected(node: FakeNode, text: str) -> bool:
    return any(e.kind == EventKind.REJECTED and text in e.message for e in node.events)


async def test_forged_rounds_by_gossip_and_sync_change_no_ledger(autojump_clock, tmp_path) -> None:
    net = FakeNet(tmp_path, 4, fast_spec(rounds=3, min_nodes=2))
    ids = [n.identity for n in net.nodes.values()]
    job, r = net.info.job_id, rules(net)
    for n in net.nodes.values():
        n.train_s = 2.0
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(1)
        head = net.ledger(net.node(0))
        # 1. The next round from a stranger: no updates, 99 contributors claimed, a huge attempt.
        await gossip(net, next_round(head, [*ids, STRANGER], job=job, rules=r, coord=STRANGER, signers=[],
                                     claim=99, attempt=2**31 - 2), STRANGER.peer_id)
        # 2. The next round from the member whose attempt 5 is, with its own update alone.
        owner = r.expected_coordinator(net.node(0).driver.book.ledger.results, 5)
        lone = next(i for i in ids if i.peer_id == owner)
        await gossip(net, next_round(head, ids, job=job, rules=r, attempt=5, signers=[lone], claim=4),
                     STRANGER.peer_id)
        # 3. Catch-up sync: a ledger of ten rounds from round 1, each the stranger's own.
        fake: list[bytes] = []
        for k in range(10):
            fake.append(next_round(fake, [*ids, STRANGER], job=job, rules=r, coord=STRANGER, signers=[STRANGER],
                                   claim=99, model=f"f{k}"))
        for node in net.alive_nodes():
            assert node.driver is not None
            assert not await node.driver.offer_ledger(fake, STRANGER.peer_id)
        await net.wait_rounds(3)
        await net.wait_until(lambda: len({tuple(net.ledger(n)) for n in net.alive_nodes()}) == 1, limit=60)
        final = net.ledger(net.node(0))
        # 4. The job is finished: a competing last round with its evidence complete (its
        # attempt's coordinator, every member's update), ground until fork choice prefers it,
        # replaces nothing.
        results = verify_chain(final, job, r)
        # The honest digest is uniform, so N tries miss with probability 1/(N+1): 20,000
        # tries (about 6 s at worst, a few tries on average) leave a 1-in-20,000 miss.
        for k in range(20_000):
            rival = next_round(final[:-1], ids, job=job, rules=r, attempt=0, model=f"rival{k}")
            if result_key(parsed([rival])[0]) < result_key(results[-1]):
                break
        assert result_key(parsed([rival])[0]) < result_key(results[-1]), "it would win were the job running"
        for node in net.alive_nodes():
            assert node.driver is not None
            await gossip(net, rival, STRANGER.peer_id)
            assert not await node.driver.offer_ledger([*final[:-1], rival], STRANGER.peer_id)
        nursery.cancel_scope.cancel()
    for node in net.alive_nodes():
        assert net.ledger(node) == final
        assert rejected(node, "round 2: plan signed by")  # the stranger's round
        assert rejected(node, "1 verified contributions < min_nodes=2")  # the lone member's
        assert rejected(node, f"ledger from {STRANGER.peer_id[-8:]}: round 1: plan signed by")
    assert all(res.coordinator != STRANGER.peer_id for res in results) and len(results) == 3


async def test_sybil_keys_private_longer_branch_leaves_the_heavier_honest_ledger_in_place(autojump_clock,
                                                                                         tmp_path) -> None:
    net = FakeNet(tmp_path, 5, fast_spec(rounds=6, min_nodes=2))  # an open job: no allowlist
    ids = [n.identity for n in net.nodes.values()]
    sybils = ids[3:]  # one party's two nodes: members like any other, until they fork
    for n in net.nodes.values():
        n.train_s = 2.0
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(4)
        # Behind the mesh's back the two keys committed rounds 3 to 6 from round 2 on their
        # own: every round passes every evidence check, the branch is the job's full length,
        # and its last model is one any node can fetch (a real one: the mesh's latest).
        honest = net.ledger(net.node(0))
        branch = private_branch(honest, ids, sybils, upto=6, fork=2, job=net.info.job_id, rules=rules(net),
                                head_model=parsed(honest)[-1].model_hash)
        # Two keys are not most of the five that did round 2's work: in an open job the branch
        # does not even verify, however its rounds were made.
        with pytest.raises(LedgerError, match="more than half"):
            verify_chain(branch, net.info.job_id, rules(net))
        held = {n.index: parsed(net.ledger(n)) for n in net.alive_nodes()}
        assert all(len(h) < len(branch) and not n.driver.book.finished  # longer, and the job still runs:
                   for n in net.alive_nodes() for h in [held[n.index]])  # weight alone decides
        assert all(chain_weight(h) > chain_weight(parsed(branch)) for h in held.values())
        for frame in branch[2:]:  # its rounds by gossip, and its whole ledger offered by sync
            await gossip(net, frame, sybils[0].peer_id)
        for node in net.alive_nodes():
            assert node.driver is not None
            assert not await node.driver.offer_ledger(branch, sybils[0].peer_id)
        await net.wait_rounds(6)
        await net.wait_until(lambda: len({tuple(net.ledger(n)) for n in net.alive_nodes()}) == 1, limit=60)
        nursery.cancel_scope.cancel()
    final = net.ledger(net.node(0))
    assert final[:4] == honest[:4] and not set(final) & set(branch[2:])
    assert len(verify_chain(final, net.info.job_id, rules(net))) == 6
    assert not any(EventKind.LEDGER_FORK_RESOLVED in n.kinds() for n in net.alive_nodes())
    # Finished: the ledger is final; a claim however heavy is worth a fetch only to report a
    # ledger on another head.
    assert not any(n.driver.may_win(LedgerClaim(6, 10**9, n.driver.head())) for n in net.alive_nodes())
    assert all(n.driver.may_win(LedgerClaim(6, 1, "0" * 16)) for n in net.alive_nodes())


async def test_a_node_on_a_longer_lighter_branch_goes_back_to_the_heavier_ledger_and_trains_on(autojump_clock,
                                                                                              tmp_path) -> None:
    net = FakeNet(tmp_path, 5, fast_spec(rounds=5, min_nodes=2))
    ids = [n.identity for n in net.nodes.values()]
    for n in net.nodes.values():
        n.train_s = 2.0
    straggler = net.node(4)
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(3)
        honest = net.ledger(net.node(0))[:3]
        assert chain_weight(parsed(honest)[1:]) > 8, "rounds 2 and 3 count every member"
        # The straggler holds a branch of four rounds forked after round 1 that three keys of
        # round 1's five contributors committed (most of the recent contributors each time:
        # every round verifies). It is longer than the mesh's ledger, and lighter than it.
        branch = private_branch(honest, ids, ids[2:5], upto=4, fork=1, job=net.info.job_id, rules=rules(net))
        assert chain_weight(parsed(branch)) < chain_weight(parsed(honest))
        book = straggler.driver.book
        book.ledger.replace(branch)
        book.advance()
        stale = book.current
        assert stale.round == 5
        assert await straggler.driver.offer_ledger(honest, net.node(0).peer_id)  # heavier, one round shorter
        assert book.committed == 3 and book.current.round == 4  # back to the mesh's next round
        assert book.round_over(stale)  # the round loop leaves round 4 of the branch it left
        await net.wait_rounds(5)
        await net.wait_until(lambda: len({tuple(net.ledger(n)) for n in net.alive_nodes()}) == 1, limit=60)
        nursery.cancel_scope.cancel()
    results = verify_chain(net.ledger(straggler), net.info.job_id, rules(net))
    assert [r.digest for r in results[:3]] == [r.digest for r in parsed(honest)]
    assert any(straggler.peer_id in {c["peer"] for c in r.contributors} for r in results[3:]), \
        "the straggler trains with the mesh again"
    assert EventKind.LEDGER_FORK_RESOLVED in straggler.kinds()


async def test_a_forged_result_that_waited_while_its_round_committed_is_still_rejected(autojump_clock,
                                                                                      tmp_path) -> None:
    """A forged result for the round being applied here waits for the apply lock; when it gets
    it, the honest result of that round is committed. It is judged as a competing result then:
    logged and penalised, not dropped without a word."""
    from gpuflex.node.core.messages import parse_result

    net = FakeNet(tmp_path, 3, fast_spec(rounds=2, min_nodes=2))
    ids = [n.identity for n in net.nodes.values()]
    for n in net.nodes.values():
        n.train_s = 2.0
    node = net.node(0)
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(1, [node])
        forged = next_round([], [*ids, STRANGER], job=net.info.job_id, rules=rules(net), coord=STRANGER, signers=[],
                            claim=99)
        assert node.driver is not None
        await node.driver.applier.apply(forged, parse_result(open_envelope(forged)), STRANGER.peer_id)
        await net.wait_rounds(2)
        nursery.cancel_scope.cancel()
    assert rejected(node, "competing result rejected: round 1: plan signed by")
    assert node.penalties.get(STRANGER.peer_id, 0) >= 1
    assert all(open_envelope(f).sender != STRANGER.peer_id for f in net.ledger(node))
