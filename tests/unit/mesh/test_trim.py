"""Which connections the mesh closes as idle (``MeshNode.idle_connections``), under trio's
MockClock: never one that carries a stream, whichever side opened it.

Trimming went by this node's own requests and by when it last heard the peer. A leader that
knew a member only by hearsay closed the member's connection while the member's update was
arriving on it; the update went to the next ancestor and the leader waited for it until its
deadline (a 300-node simulated round of 4 s took 42 s)."""

from __future__ import annotations

import trio

from mesh.identity import Identity
from mesh.inbound import InboundStreams
from mesh.node import TRIM_IDLE_S, MeshConfig, MeshNode
from mesh.testing.simnet import SimNetwork

STRANGER = Identity(bytes(range(3, 35))).peer_id  # connected, outside the keep set, never heard


def node_with_one_stranger() -> MeshNode:
    node = MeshNode(Identity(bytes(range(32))), MeshConfig(transport=SimNetwork(0)))
    node.keep_set = lambda: set()  # type: ignore[method-assign]
    node.connected_ids = lambda: {STRANGER}  # type: ignore[method-assign]
    return node


async def test_a_connection_with_a_stream_open_is_never_idle_however_long_the_stream_lasts(autojump_clock) -> None:
    node = node_with_one_stranger()
    assert node.idle_connections() == [STRANGER]  # the rule itself: unused, unheard
    with node.in_use(STRANGER):
        await trio.sleep(10 * TRIM_IDLE_S)
        assert node.idle_connections() == []
        with node.in_use(STRANGER):  # a second stream ends first: the first still counts
            pass
        await trio.sleep(2 * TRIM_IDLE_S)
        assert node.idle_connections() == []
    await trio.sleep(TRIM_IDLE_S - 1)
    assert node.idle_connections() == []  # used until just now
    await trio.sleep(2)
    assert node.idle_connections() == [STRANGER]


class _Stream:
    class muxed_conn:
        peer_id = STRANGER

    async def close(self) -> None:
        pass

    async def reset(self) -> None:
        pass


async def test_a_peer_stream_being_served_keeps_its_connection(autojump_clock) -> None:
    """The inbound side: ``InboundStreams.guard`` holds the peer in use while its handler runs."""

    node = node_with_one_stranger()
    guarded = InboundStreams(node).guard(lambda stream, remote: trio.sleep(3 * TRIM_IDLE_S))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(guarded, _Stream())
        await trio.sleep(2 * TRIM_IDLE_S)
        assert node.idle_connections() == []
    await trio.sleep(TRIM_IDLE_S + 1)
    assert node.idle_connections() == [STRANGER]
