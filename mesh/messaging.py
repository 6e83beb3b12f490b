"""Direct messages and flood gossip between mesh peers.

Direct: one stream per message on ``/gpuflex/msg/1.0.0`` carrying a signed envelope, an
optional bulk payload, and a reply. The envelope's signer must be the peer at the other end
of the Noise session, so a peer cannot speak for another.

Gossip: ``/gpuflex/gossip/1.0.0`` carries an envelope signed by its origin; each node delivers
it once (deduplicated by message id) and forwards it to its overlay neighbours
(``mesh.gossip``, ``mesh.overlay``). Not py-libp2p's gossipsub: it drops messages over 1 MiB
silently (a round's result may be 12 MiB) and has a 120 s default heartbeat in the pinned
py-libp2p (``benchmarks/gossipsub_limit.py``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mesh.codec import Envelope, WireError, WireReason
from mesh.errors import MeshError

MSG_PROTOCOL = "/gpuflex/msg/1.0.0"
GOSSIP_PROTOCOL = "/gpuflex/gossip/1.0.0"

log = logging.getLogger("mesh.messaging")


@dataclass(frozen=True)
class Inbound:
    """A verified message as handed to an application handler."""

    envelope: Envelope
    payload: bytes | None
    via: str  # the peer on the other end of the stream (the forwarder, for gossip)
    gossip: bool


Handler = Callable[[Inbound], Awaitable[Any]]
#: How many payload bytes a message may carry: a number, or asked of the layer that knows
#: (a job's update is as large as its model allows) once the signed frame has verified.
PayloadLimit = int | Callable[[Envelope], Awaitable[int]]


class Rejected(MeshError):
    """Raised by a handler to refuse a message without penalising the sender."""


class SendError(MeshError, RuntimeError):
    """A message could not be delivered, or the receiver refused it."""


class HandlerTable:
    """Routes verified envelopes to the handler registered for their kind, and says how large
    a payload each kind may bring: none unless its handler says so."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._payloads: dict[str, PayloadLimit] = {}

    def register(self, kind: str, handler: Handler, max_payload: PayloadLimit = 0) -> None:
        self._handlers[kind] = handler
        self._payloads[kind] = max_payload

    def has(self, kind: str) -> bool:
        return kind in self._handlers

    async def payload_limit(self, env: Envelope) -> int:
        """Bytes of payload ``env`` may carry (0 for a kind with no handler)."""
        limit = self._payloads.get(env.kind, 0)
        return limit if isinstance(limit, int) else await limit(env)

    async def dispatch(self, msg: Inbound) -> Any:
        handler = self._handlers.get(msg.envelope.kind)
        if handler is None:
            raise WireError(WireReason.KIND, f"no handler for {msg.envelope.kind} messages")
        return await handler(msg)


class SeenCache:
    """Bounded memory of gossip message ids already delivered."""

    def __init__(self, capacity: int = 50_000) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._ids

    def add(self, msg_id: bytes) -> bool:
        """Record ``msg_id``; False when it was already there."""
        if msg_id in self._ids:
            self._ids.move_to_end(msg_id)
            return False
        self._ids[msg_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
        return True
