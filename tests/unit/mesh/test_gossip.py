"""The overlay (mesh.overlay) and gossip over it (mesh.gossip), one layer at a time.

The overlay is pure: checked on 500 made-up members. Gossip runs over a modelled
set of nodes that deliver frames to each other's real ``Gossip`` and ``SeenCache``.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

import trio

from mesh.codec import open_envelope, register_kind, seal
from mesh.gossip import IHAVE, PULL_ABOVE, Gossip
from mesh.health import PeerTable, protocol_clock
from mesh.identity import Identity
from mesh.messaging import HandlerTable, Inbound, SeenCache
from mesh.overlay import DEGREE, neighbours

IDS = [f"peer-{i:04d}" for i in range(500)]
NOTE = "test_note"
register_kind(NOTE, 64 * 1024)


def test_every_node_has_degree_neighbours_and_every_link_is_mutual() -> None:
    chosen = {p: neighbours(p, IDS) for p in IDS}
    assert {len(n) for n in chosen.values()} == {DEGREE}
    for p, ns in chosen.items():
        for q in ns:
            assert p in chosen[q], "every link is mutual"


def test_the_overlay_is_a_small_world() -> None:
    chosen = {p: neighbours(p, IDS) for p in IDS}
    hops = {IDS[0]: 0}
    queue = deque([IDS[0]])
    while queue:
        p = queue.popleft()
        for q in chosen[p]:
            if q not in hops:
                hops[q] = hops[p] + 1
                queue.append(q)
    assert len(hops) == len(IDS)
    assert max(hops.values()) <= 8  # a ring alone would need 500 / 4 = 125
    # Links are mutual: nobody is sent more than DEGREE copies, or watched by more.
    indegree = Counter(q for ns in chosen.values() for q in ns)
    assert max(indegree.values()) == DEGREE


def test_small_meshes_are_fully_connected() -> None:
    assert sorted(neighbours(IDS[0], IDS[:DEGREE + 1])) == sorted(IDS[1:DEGREE + 1])


class Node:
    """A GossipHost whose streams are calls into other Nodes."""

    def __init__(self, net: dict[str, Node]) -> None:
        self.identity = Identity.generate()
        self.peer_id = self.identity.peer_id
        self.peers = PeerTable(clock=protocol_clock)
        self.seen = SeenCache()
        self.handlers = HandlerTable()
        self.bytes_sent = 0
        self.net = net
        self.received: list[int] = []  # sizes of frames that arrived
        self.gossip = Gossip(self)
        net[self.peer_id] = self

    def neighbours(self) -> list[str]:
        return neighbours(self.peer_id, [p for p in self.net if p != self.peer_id])

    async def open(self, peer: str, protocol: str, timeout: float) -> Any:
        return Pipe(self, self.net[peer])

    async def request(self, peer: str, frame: bytes, payload: Any = None, timeout: float = 30.0) -> Any:
        env = open_envelope(frame)
        return await self.net[peer].handlers.dispatch(Inbound(env, None, self.peer_id, gossip=False))

    async def take(self, frame: bytes, via: str) -> None:
        """What mesh.inbound does with a gossip stream: de-duplicate, relay, deliver."""
        self.received.append(len(frame))
        env = open_envelope(frame)
        if not self.seen.add(env.msg_id):
            return
        await self.gossip.forward(frame, env.msg_id, {via, env.sender})


class Pipe:
    def __init__(self, src: Node, dst: Node) -> None:
        self.src, self.dst, self.buf = src, dst, b""

    async def write(self, data: bytes) -> None:
        self.buf += data

    async def close(self) -> None:
        await self.dst.take(self.buf[4:], self.src.peer_id)  # write_frame: a 4-byte length first


async def spread(n: int, size: int) -> tuple[list[Node], bytes]:
    net: dict[str, Node] = {}
    nodes = [Node(net) for _ in range(n)]
    origin = nodes[0]
    frame = seal(origin.identity, NOTE, {"pad": b"x" * size})
    env = open_envelope(frame)
    origin.seen.add(env.msg_id)
    await origin.gossip.forward(frame, env.msg_id, set())
    return nodes, frame


async def test_a_message_reaches_every_node_with_at_most_degree_copies_each() -> None:
    nodes, _ = await spread(60, 100)
    rest = nodes[1:]
    assert all(n.received for n in rest)
    assert max(len(n.received) for n in rest) <= DEGREE


async def test_a_large_message_is_pulled_so_each_node_takes_it_in_about_once() -> None:
    nodes, frame = await spread(60, PULL_ABOVE + 1000)
    assert len(frame) > PULL_ABOVE
    rest = nodes[1:]
    assert all(n.received for n in rest)
    full = [sum(1 for s in n.received if s == len(frame)) for n in rest]
    assert max(full) == 1, "offers to a node that has the message are declined"
    assert sum(n.gossip.offered for n in nodes) > sum(n.gossip.pushed for n in nodes)


async def test_an_offer_is_declined_when_the_message_is_here_or_on_its_way(autojump_clock) -> None:
    net: dict[str, Node] = {}
    a, b = Node(net), Node(net)
    msg_id = b"\x01" * 32

    async def offer() -> bool:
        frame = seal(a.identity, IHAVE, {"id": msg_id})
        return bool(await b.handlers.dispatch(Inbound(open_envelope(frame), None, a.peer_id, gossip=False)))

    assert await offer() is True
    assert await offer() is False  # another neighbour is sending it
    await trio.sleep(60)
    assert await offer() is True  # that one never came: taken from the next offer
    b.seen.add(msg_id)
    assert await offer() is False
