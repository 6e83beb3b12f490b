"""The modelled links (``mesh.testing.simnet``): bulk writes queue in order, a small write
waits at most ``SPARSE_QUEUE_S`` behind them and still takes its share of the link.

Queued strictly in order, a ping to a root receiving a hundred 10 MB updates would wait
behind all of them, 80 s at 100 Mbit/s, where TCP's windows and a router's queue bound the
wait of a sparse flow to a few milliseconds under fq_codel."""

from __future__ import annotations

import pytest

from mesh.identity import Identity
from mesh.testing.simnet import SPARSE_BYTES, SPARSE_QUEUE_S, LinkModel, SimHost, SimNetwork

MB = 1_000_000


def two_hosts(up_bps: float, down_bps: float) -> tuple[SimNetwork, SimHost, SimHost]:
    net = SimNetwork(0)
    ids = Identity(bytes(range(32))), Identity(bytes(range(1, 33)))
    for ident in ids:
        net.place(ident.peer_id, LinkModel(up_bps=up_bps, down_bps=down_bps, access_ms=5.0))
    a, b = (net.build_host(ident, [], []) for ident in ids)
    a.online = b.online = True
    return net, a, b


async def test_bulk_writes_queue_in_order_on_the_receivers_downlink(autojump_clock) -> None:
    net, a, b = two_hosts(up_bps=800 * MB, down_bps=80 * MB)  # 10 MB: 0.1 s up, 1 s down
    landed = [net.transmit(a, b, 10 * MB)[1] for _ in range(3)]
    delay = net.delay(a, b)
    assert landed == pytest.approx([delay + 0.1 + 0.9 + k for k in range(3)], abs=1e-3)


async def test_a_small_write_waits_at_most_the_sparse_queue_behind_bulk_and_delays_it(autojump_clock) -> None:
    net, a, b = two_hosts(up_bps=800 * MB, down_bps=80 * MB)
    for _ in range(10):  # ten seconds of bulk booked on b's downlink
        net.transmit(a, b, 10 * MB)
    booked = b._down_free
    _, landed = net.transmit(a, b, 64)
    assert landed is not None and landed < net.delay(a, b) + 2 * SPARSE_QUEUE_S + 1e-3  # at most that on each link
    assert b._down_free == pytest.approx(booked + 64 * 8 / (80 * MB))  # its bytes still take the link
    _, after = net.transmit(a, b, SPARSE_BYTES + 1)  # a bulk write again waits for all of it
    assert after is not None and after > booked
