"""The budgets of a public node's relay service, around py-libp2p's circuit relay v2 hop handler.

A relay lends its bandwidth and its slots to peers behind NAT. py-libp2p 0.8.1's hop handler
gives them away on terms an attacker sets (measured against a real node on loopback):

* a RESERVE names the peer to reserve for, and the handler takes that field at its word, so
  one connection filled all 32 slots with made-up peer ids in 0.3 s, and each slot was held
  for an hour;
* a reserved peer's ``max_circuits`` circuits go to whoever asks first, so one source could
  take them all and every other peer got ``NO_RESERVATION``;
* the duration cap is checked only when bytes arrive, so an idle circuit outlived it;
* a circuit carries any bytes at all, not only the mesh's own connections.

:class:`HopGuard` wraps the handler's three steps (reserve, connect, relay) with this node's
rules: a reservation only for the connected peer and only for a peer of this mesh, at most
``max_reservations_per_network`` per network prefix (``mesh.netprefix``; loopback has none),
lasting ``reservation_ttl_s``, released when its holder disconnects; at most
``max_circuits_per_source`` circuits from one source to one reserved peer; the duration cap
as a trio deadline on each direction of a circuit; and, unless ``carry_any``, only a libp2p
connection that opens with the Noise handshake negotiation, the mesh's one transport security.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import trio

from mesh.netprefix import network_prefix
from mesh.reachability import direct_ips

log = logging.getLogger("mesh.relay")

#: What the dialling side of every libp2p connection sends first over a circuit: the
#: multistream-select header, then its proposal of Noise (the only security a mesh host offers).
#: Each is forwarded as soon as it is checked: the dialler waits for the answer to the first.
NOISE_OPENING = (b"\x13/multistream/1.0.0\n", b"\x07/noise\n")
#: How long a new circuit's source has to send that opening.
OPENING_TIMEOUT_S = 10.0
#: Refusals of one kind are logged at most this often (with a count); all are in ``relay_load``.
LOG_EVERY_S = 30.0


async def _read_exactly(stream: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.read(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


class HopGuard:
    """Installs this node's relay budgets on a ``CircuitV2Protocol`` (see the module doc)."""

    def __init__(self, protocol: Any, limits: Any, member: Callable[[str], bool] | None = None) -> None:
        """``limits``: the node's ``mesh.relay.RelayLimitsConfig``; ``member(peer_id)``: whether
        ``peer_id`` is a peer of this mesh (None: any peer)."""
        self.protocol, self.limits = protocol, limits
        self.host = protocol.host
        self._member = member
        self._circuits: Counter[tuple[bytes, bytes]] = Counter()  # (source, destination) -> open
        self._sources: weakref.WeakSet[Any] = weakref.WeakSet()  # the source side of each circuit
        self.refused: Counter[str] = Counter()  # requests refused, by kind, for the report
        self._logged: dict[str, tuple[float, int]] = {}  # kind -> (when last logged, count then)
        self._wrap()

    # -- what a request may have --------------------------------------------------------------

    def _ip(self, peer_id: Any) -> str | None:
        ips = direct_ips(self.host, peer_id)
        return ips[0] if ips else None

    def prune(self) -> None:
        """Forget reservations that lapsed or whose holder left: a slot is held only by a peer
        connected to this relay (as the relay v2 spec says), so a departed peer frees it."""
        rm = self.protocol.resource_manager
        rm._clean_expired()
        for peer in list(rm._reservations):
            if not rm._is_peer_connected(peer):
                del rm._reservations[peer]

    def note(self, kind: str, message: str) -> None:
        """Count a refusal; log it, with how many were held back, at most every ``LOG_EVERY_S``."""
        self.refused[kind] += 1
        now = trio.current_time()
        last, count = self._logged.get(kind, (-math.inf, 0))
        if now - last >= LOG_EVERY_S:
            held = self.refused[kind] - count - 1
            log.info("relay: %s%s", message, f" ({held} more like it since the last report)" if held else "")
            self._logged[kind] = (now, self.refused[kind])

    def reserve_refusal(self, peer: Any) -> str | None:
        """Why ``peer`` (the connected peer) gets no reservation here, or None."""
        if not self.limits.carry_any and self._member is not None and not self._member(peer.to_base58()):
            return "not a peer of this mesh"
        self.prune()
        rm = self.protocol.resource_manager
        if peer in rm._reservations:
            return None  # a renewal
        prefix = network_prefix(self._ip(peer))
        if prefix is not None:
            same = sum(1 for other in rm._reservations if network_prefix(self._ip(other)) == prefix)
            if same >= self.limits.max_reservations_per_network:
                return f"{same} reservations already held from network {prefix}"
        return None

    # -- the three steps, wrapped ---------------------------------------------------------------

    def _wrap(self) -> None:
        protocol = self.protocol
        handle_reserve, handle_connect, relay_data = (protocol._handle_reserve, protocol._handle_connect,
                                                      protocol._relay_data)

        async def refuse(stream: Any, code: Any, kind: str, why: str, peer: Any) -> None:
            from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
            from libp2p.relay.circuit_v2.protocol_buffer import to_proto_status
            from libp2p.relay.circuit_v2.utils import write_delimited_msg

            self.note(kind, f"request from {str(peer)[-8:]} refused: {why}")
            with trio.move_on_after(5), suppress(Exception):
                await write_delimited_msg(stream, HopMessage(type=HopMessage.STATUS, status=to_proto_status(code)))

        async def guarded_reserve(stream: Any, msg: Any) -> None:
            from libp2p.relay.circuit_v2.protocol_buffer import StatusCode

            peer = stream.muxed_conn.peer_id
            msg.ClearField("peer")  # a reservation is for the peer on this connection, nobody else
            why = self.reserve_refusal(peer)
            if why is not None:
                await refuse(stream, StatusCode.RESERVATION_REFUSED, "reservation", why, peer)
                return
            await handle_reserve(stream, msg)

        async def guarded_connect(stream: Any, msg: Any) -> None:
            from libp2p.relay.circuit_v2.protocol_buffer import StatusCode

            source = stream.muxed_conn.peer_id
            key = (source.to_bytes(), bytes(msg.peer.id))
            if self._circuits[key] >= self.limits.max_circuits_per_source:
                await refuse(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, "circuit per source",
                             f"{self._circuits[key]} circuits already open from this source to that peer", source)
                with suppress(Exception):
                    await stream.reset()
                return
            self._circuits[key] += 1
            self._sources.add(stream)
            try:
                await handle_connect(stream, msg)
            finally:
                self._circuits[key] -= 1
                if self._circuits[key] <= 0:
                    del self._circuits[key]

        async def guarded_data(src: Any, dst: Any, peer_id: Any, *args: Any) -> None:
            cap = self.limits.max_circuit_duration_s
            with trio.move_on_after(cap if cap > 0 else math.inf) as scope:
                if src in self._sources and not self.limits.carry_any and not await self._opens_noise(src, dst):
                    self.note("not noise",
                              f"circuit from {str(peer_id)[-8:]} closed: it does not open a Noise connection")
                    await self._reset(src, dst)
                    return
                await relay_data(src, dst, peer_id, *args)
            if scope.cancelled_caught:
                self.note("time cap", f"circuit of {str(peer_id)[-8:]} closed at its {cap} s time cap")
                await self._reset(src, dst)

        protocol._handle_reserve = guarded_reserve
        protocol._handle_connect = guarded_connect
        protocol._relay_data = guarded_data

    async def _opens_noise(self, src: Any, dst: Any) -> bool:
        """Check the circuit's first bytes from its source and forward each part that passes."""
        with trio.move_on_after(OPENING_TIMEOUT_S):
            try:
                for part in NOISE_OPENING:
                    if await _read_exactly(src, len(part)) != part:
                        return False
                    await dst.write(part)
                return True
            except Exception:  # py-libp2p's reset and EOF errors share no base class
                return False
        return False

    @staticmethod
    async def _reset(*streams: Any) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            for stream in streams:
                with suppress(Exception):
                    await stream.reset()
