"""The join scheduler under trio's MockClock: parallel best-first dialling, up at the first
answer, the first-run typo, and patience with backoff. No real waiting, no network."""

from __future__ import annotations

import itertools
import random

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from mesh.bootstrap import BootstrapError, Candidate, Joiner, JoinPolicy, backoff_delay

POLICY = JoinPolicy(first_run_timeout_s=30, dial_timeout_s=10, parallel=8, backoff_min_s=1,
                    backoff_max_s=60, jitter=0.0, check_s=1)


class FakeNet:
    """Peers that answer after ``latency`` seconds, or fail (refused) or never answer (black hole)."""

    def __init__(self) -> None:
        self.latency: dict[str, float] = {}
        self.up: set[str] = set()
        self.blackhole: set[str] = set()
        self.dials: list[tuple[float, str, str]] = []
        self.results: list[tuple[str, str, str | None]] = []
        self.connected = False

    async def dial(self, peer: str, addr: str) -> None:
        self.dials.append((trio.current_time(), peer, addr))
        if addr in self.blackhole:
            await trio.sleep_forever()
        await trio.sleep(self.latency.get(addr, 0.5))
        if addr not in self.up:
            raise ConnectionRefusedError(f"{addr} refused")
        self.connected = True

    def noted(self, peer: str, addr: str, error: str | None) -> None:
        self.results.append((peer, addr, error))


def cand(i: int, *ports: int, source: str = "book") -> Candidate:
    return Candidate(f"peer{i}", tuple(f"/ip4/10.0.0.{i}/tcp/{p}" for p in ports or (4001,)), source)  # type: ignore[arg-type]


def joiner(net: FakeNet, cands: list[Candidate], policy: JoinPolicy = POLICY) -> Joiner:
    return Joiner(net.dial, lambda: list(cands), lambda: net.connected, policy,
                  rng=random.Random(1), on_dial=net.noted)


async def test_dials_best_first_in_parallel_and_is_up_at_the_first_answer(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNet()
    cands = [cand(i) for i in range(12)]
    net.blackhole = {c.addrs[0] for c in cands[:5]}  # the best five never answer
    net.up = {cands[6].addrs[0], cands[9].addrs[0]}
    net.latency = {cands[6].addrs[0]: 3.0, cands[9].addrs[0]: 0.2}
    j = joiner(net, cands)
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        await nursery.start(j.run, False)
        up_after = trio.current_time() - t0
        assert j.state == "connected" and j.reached_via == "peer9"
        # Eight at once, in rank order; the ninth, tenth... start as slots free up.
        assert [p for _, p, _ in net.dials[:8]] == [f"peer{i}" for i in range(8)]
        assert all(t == t0 for t, _, _ in net.dials[:8])
        assert up_after == pytest.approx(0.5 + 0.2)  # peer9 started when peer5 failed at 0.5s
        await trio.sleep(20)  # the dials still in flight finish in the background
        assert ("peer6", cands[6].addrs[0], None) in net.results
        assert sum(1 for _, _, e in net.results if e and "no answer within 10s" in e) == 5
        nursery.cancel_scope.cancel()


async def test_each_address_of_a_peer_is_tried_in_order(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNet()
    moved = cand(1, 4001, 5002)  # the bootstrap's old port, then the port the book learned
    net.up = {moved.addrs[1]}
    j = joiner(net, [moved])
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run, False)
        assert [a for _, _, a in net.dials] == list(moved.addrs)
        assert net.results[0][2] is not None and net.results[1] == ("peer1", moved.addrs[1], None)
        nursery.cancel_scope.cancel()


async def test_a_brand_new_node_with_a_wrong_bootstrap_fails_within_the_timeout(
        autojump_clock: trio.abc.Clock) -> None:
    net = FakeNet()
    typo = cand(1, 4002, source="bootstrap")
    j = joiner(net, [typo])
    t0 = trio.current_time()
    with pytest.raises(BootstrapError, match=r"cannot reach any bootstrap peer \(/ip4/10.0.0.1/tcp/4002/p2p/peer1: "
                                             r"ConnectionRefusedError"):
        await j.run(False)  # a plain error, not one wrapped in an exception group
    took = trio.current_time() - t0
    assert POLICY.first_run_timeout_s <= took < POLICY.first_run_timeout_s + 0.01
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(net.dials)]
    assert max(gaps) <= POLICY.first_run_backoff_max_s + 0.5 + 1e-9  # kept trying until the end


async def test_a_node_that_has_been_in_a_mesh_waits_with_backoff_and_never_exits(
        autojump_clock: trio.abc.Clock) -> None:
    net = FakeNet()
    cands = [cand(1, source="bootstrap"), cand(2), cand(3)]
    j = joiner(net, cands)
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        await nursery.start(j.run, True)
        assert trio.current_time() - t0 == pytest.approx(0.5)  # up after one round, not the timeout
        assert j.state == "waiting" and j.attempt == 1
        status = j.status()
        assert status["next_retry_s"] == pytest.approx(1.0) and status["tried"] == 3
        assert "refused" in status["last_error"]
        await trio.sleep(600)  # ten minutes with no one answering
        assert j.state == "waiting"
        starts = sorted({round(t - t0, 3) for t, _, _ in net.dials})
        gaps = [round(b - a - 0.5, 3) for a, b in itertools.pairwise(starts)]
        assert gaps[:7] == [1, 2, 4, 8, 16, 32, 60]  # doubling, capped at backoff_max_s
        assert set(gaps[6:]) == {60}
        assert j.status()["next_retry_s"] <= 60
        # The mesh comes back: the next try finds it.
        net.up = {cands[2].addrs[0]}
        await trio.sleep(61)
        assert j.state == "connected" and j.attempt == 0 and j.reached_via == "peer3"
        nursery.cancel_scope.cancel()


async def test_a_peer_dialling_in_ends_the_wait_at_once(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNet()
    j = joiner(net, [cand(1)])
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run, True)
        await trio.sleep(200)
        assert j.state == "waiting" and j.attempt >= 6
        dials = len(net.dials)
        net.connected = True  # someone reached this node
        await trio.sleep(POLICY.check_s + 0.01)
        assert j.state == "connected" and j.attempt == 0
        assert len(net.dials) == dials
        nursery.cancel_scope.cancel()


async def test_nothing_to_dial_starts_a_new_mesh_and_alone_again_dials_the_book(
        autojump_clock: trio.abc.Clock) -> None:
    net = FakeNet()
    cands: list[Candidate] = []
    j = Joiner(net.dial, lambda: list(cands), lambda: net.connected, POLICY, rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        await nursery.start(j.run, False)
        assert trio.current_time() == t0 and j.state == "new-mesh"
        await trio.sleep(30)
        assert j.state == "new-mesh" and not net.dials
        net.connected = True  # a peer joined; the book learns it
        cands.append(cand(7))
        await trio.sleep(2)
        assert j.state == "connected"
        net.connected = False  # every peer went away: back to what the node knows
        alone_at = trio.current_time()
        await trio.sleep(POLICY.check_s + 0.5 + 0.01)  # noticed within one check; one dial of 0.5s
        assert net.dials[0][1] == "peer7" and net.dials[0][0] - alone_at <= POLICY.check_s
        assert j.attempt == 1 and "refused" in j.last_error
        nursery.cancel_scope.cancel()


@given(attempt=st.integers(min_value=-3, max_value=10_000), low=st.floats(0.01, 10), high=st.floats(10, 600),
       jitter=st.floats(0, 0.5), seed=st.integers(0, 2**32))
def test_backoff_stays_within_its_bounds(attempt: int, low: float, high: float, jitter: float, seed: int) -> None:
    delay = backoff_delay(attempt, low, high, jitter, random.Random(seed))
    assert low * (1 - jitter) - 1e-9 <= delay <= high * (1 + jitter) + 1e-9
