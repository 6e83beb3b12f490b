"""The inbound bounds (mesh.limits, mesh.inbound.guard): quotas per peer and in total, the
gossip token buckets, and a stream handler guarded by its quota."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import trio

from mesh.inbound import InboundStreams
from mesh.limits import Busy, Charge, PeerLimits, Quota, RateLimiter


def test_a_quota_refuses_past_the_peer_share_and_past_the_total() -> None:
    q = Quota(per_peer=2, total=3, what="streams")
    q.take("a")
    q.take("a")
    with pytest.raises(Busy, match="peer"):
        q.take("a")
    q.take("b")
    with pytest.raises(Busy, match="all peers"):
        q.take("c")
    q.give("a")
    q.take("c")
    assert (q.of("a"), q.of("b"), q.of("c"), q.used) == (1, 1, 1, 3)


def test_a_charge_gives_back_every_byte_it_took() -> None:
    q = Quota(per_peer=100, total=100, what="bytes")
    charge = Charge(q, "a")
    charge(60)
    with pytest.raises(Busy):
        charge(41)
    charge.release()
    assert q.used == 0 and q.of("a") == 0


def test_the_rate_limiter_allows_a_burst_then_its_rate_and_forgets_old_keys() -> None:
    now = [0.0]
    rl = RateLimiter(rate=10.0, burst=5.0, keys=2, clock=lambda: now[0])
    assert sum(rl.allow("origin") for _ in range(50)) == 5
    now[0] += 0.3  # three tokens at 10 a second
    assert sum(rl.allow("origin") for _ in range(50)) == 3
    now[0] += 60.0  # never more saved up than the burst
    assert sum(rl.allow("origin") for _ in range(50)) == 5
    rl.allow("x")
    rl.allow("y")  # "origin" is forgotten: it starts again with a full bucket
    assert sum(rl.allow("origin") for _ in range(50)) == 5


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="read_timeout_s"):
        PeerLimits(read_timeout_s=0)


class _Conn:
    peer_id = "12D3KooWpeer"


class _Stream:
    muxed_conn = _Conn()

    def __init__(self) -> None:
        self.reset_called = self.closed = False

    async def reset(self) -> None:
        self.reset_called = True

    async def close(self) -> None:
        self.closed = True


class _Peers:
    def is_ignored(self, peer: str) -> bool:
        return False


class _Node:
    limits = PeerLimits(relay_streams_per_peer=2)
    peers = _Peers()

    def in_use(self, peer: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


async def test_a_guarded_handler_is_refused_past_its_peer_quota_and_frees_its_slot() -> None:
    inbound = InboundStreams(_Node())  # type: ignore[arg-type]
    release = trio.Event()
    served: list[Any] = []

    async def hold(stream: Any) -> None:
        served.append(stream)
        await release.wait()

    guarded = inbound.guard_plain(hold, "relay_streams")
    streams = [_Stream() for _ in range(4)]
    async with trio.open_nursery() as nursery:
        for s in streams:
            nursery.start_soon(guarded, s)
        await trio.testing.wait_all_tasks_blocked()
        assert len(served) == 2 and inbound.refused == 2
        assert [s.reset_called for s in streams].count(True) == 2
        release.set()
    assert inbound.quotas.relay_streams.used == 0
    assert all(s.closed for s in served)


async def test_gossip_streams_cannot_take_the_slots_of_work_messages() -> None:
    """A burst of gossip (every member's presence as a round begins) fills the gossip budget;
    a child's partial on a message stream is still served."""
    inbound = InboundStreams(_Node())  # type: ignore[arg-type]
    release = trio.Event()
    served: list[str] = []

    async def hold(stream: Any, remote: str) -> None:
        served.append("gossip")
        await release.wait()

    async def work(stream: Any, remote: str) -> None:
        served.append("work")

    gossip, message = inbound.guard(hold, "gossip_streams"), inbound.guard(work)
    per_peer = _Node.limits.gossip_streams_per_peer
    async with trio.open_nursery() as nursery:
        for _ in range(per_peer + 3):
            nursery.start_soon(gossip, _Stream())
        await trio.testing.wait_all_tasks_blocked()
        assert served.count("gossip") == per_peer and inbound.refused_by == {"gossip_streams": 3}
        await message(_Stream())
        assert served.count("work") == 1
        release.set()
    assert inbound.quotas.gossip_streams.used == 0 and inbound.quotas.streams.used == 0
