"""Gossip over the overlay: each message to the node's D neighbours, large ones pulled.

A gossiped frame goes from its origin to the origin's overlay neighbours (``mesh.overlay``),
and each node that takes it in for the first time (de-duplicated by message id, metered per
origin in ``mesh.inbound``) passes it on to its own neighbours, less the one it came from
and the origin. A node therefore receives at most D copies of a message, whatever the size of
the mesh, and the overlay's long links carry it across in O(log n) hops.

A frame larger than ``PULL_ABOVE`` is not pushed blind: the forwarder first says it has it
(``ihave``, a direct message naming the id), and pushes it only if the neighbour answers that
it wants it (gossipsub's IHAVE/IWANT, folded into one round trip). A neighbour that already
has the message, or is being sent it by another neighbour, says no; so a large message
crosses each node's downlink about once instead of D times.

Kinds in ``direct_only`` (presence) are sent by their origin straight to every peer it
believes up and never relayed; they go one hop, so they are refreshed, not flooded.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from mesh.codec import register_kind, seal
from mesh.framing import write_frame
from mesh.health import PeerTable
from mesh.identity import Identity
from mesh.inbound import close
from mesh.messaging import GOSSIP_PROTOCOL, HandlerTable, Inbound, SeenCache, SendError

log = logging.getLogger("mesh.gossip")
IHAVE = "ihave"
register_kind(IHAVE, 512)
#: Frames above this many bytes are announced and pulled rather than pushed.
PULL_ABOVE = 16 << 10
#: A gossip push to one peer: opening the stream, then the whole push.
GOSSIP_OPEN_S, GOSSIP_PUSH_S = 5.0, 10.0
#: Message ids this node has said it wants, and how long that holds off other offers.
MAX_WANTED, WANT_HOLD_S = 4096, GOSSIP_PUSH_S


class GossipHost(Protocol):
    """What gossip uses of its node (``mesh.node.MeshNode``)."""

    peer_id: str
    identity: Identity
    peers: PeerTable
    seen: SeenCache
    handlers: HandlerTable
    bytes_sent: int

    def neighbours(self) -> list[str]: ...

    async def open(self, peer: str, protocol: str, timeout: float) -> Any: ...

    async def request(self, peer: str, frame: bytes, payload: bytes | memoryview | None = None,
                      timeout: float = 30.0) -> Any: ...


class Gossip:
    def __init__(self, node: GossipHost) -> None:
        self.node = node
        self._wanted: dict[bytes, float] = {}  # message id -> trio time the offer taken expires
        self.pushed = self.offered = self.declined = 0  # for status and benchmarks
        node.handlers.register(IHAVE, self._on_ihave)

    async def forward(self, frame: bytes, msg_id: bytes, exclude: set[str], everyone: bool = False) -> int:
        """Send ``frame`` to the overlay neighbours not in ``exclude`` (or, ``everyone``, to
        every peer up); returns how many it was sent or offered to."""
        targets = self.node.peers.alive() if everyone else self.node.neighbours()
        targets = [p for p in targets if p not in exclude and p != self.node.peer_id]
        pull = len(frame) > PULL_ABOVE and not everyone

        async def send(peer: str) -> None:
            with trio.move_on_after(GOSSIP_PUSH_S):
                try:
                    if pull and not await self._offer(peer, msg_id):
                        return
                    await self._push(peer, frame)
                except Exception as exc:  # best effort: other neighbours cover a miss
                    log.debug("gossip to %s failed: %s", peer[-8:], exc)

        async with trio.open_nursery() as nursery:
            for peer in targets:
                nursery.start_soon(send, peer)
        return len(targets)

    async def push_to(self, frame: bytes, peers: list[str]) -> int:
        """Send ``frame`` straight to ``peers`` (one hop, side by side, each within its push
        timeout): a ``direct_only`` kind meant for some peers only, such as a job's presence."""

        async def send(peer: str) -> None:
            with trio.move_on_after(GOSSIP_PUSH_S):
                try:
                    await self._push(peer, frame)
                except Exception as exc:  # best effort: the next refresh covers a miss
                    log.debug("direct gossip to %s failed: %s", peer[-8:], exc)

        async with trio.open_nursery() as nursery:
            for peer in peers:
                if peer != self.node.peer_id:
                    nursery.start_soon(send, peer)
        return len(peers)

    async def _push(self, peer: str, frame: bytes) -> None:
        stream = await self.node.open(peer, GOSSIP_PROTOCOL, GOSSIP_OPEN_S)
        try:
            await write_frame(stream, frame)
            self.node.bytes_sent += len(frame)
            self.pushed += 1
        finally:
            await close(stream)

    async def _offer(self, peer: str, msg_id: bytes) -> bool:
        self.offered += 1
        try:
            want = await self.node.request(peer, seal(self.node.identity, IHAVE, {"id": msg_id}),
                                           timeout=GOSSIP_OPEN_S)
        except SendError as exc:
            log.debug("ihave to %s failed: %s", peer[-8:], exc)
            return False
        if want is not True:
            self.declined += 1
        return want is True

    async def _on_ihave(self, msg: Inbound) -> bool:
        """Want the message unless it is here already or another neighbour is sending it."""
        body = msg.envelope.body
        msg_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(msg_id, bytes) or len(msg_id) > 64 or msg_id in self.node.seen:
            return False
        now = trio.current_time()
        if self._wanted.get(msg_id, 0.0) > now:
            return False
        if len(self._wanted) >= MAX_WANTED:
            self._wanted = {k: t for k, t in self._wanted.items() if t > now}
            if len(self._wanted) >= MAX_WANTED:
                return True  # too many offers in flight to keep track: take this one
        self._wanted[msg_id] = now + WANT_HOLD_S
        return True
