"""Circuit relay v2 and hole punching, from py-libp2p, driven by this node's reachability.

Measured on the namespace NAT topology (``benchmarks/nat_probe.py``), py-libp2p 0.8.1's relay
pieces work when driven directly, so GPUFlex uses them as they are:

* ``CircuitV2Protocol``: the hop service (on public nodes) and the stop handler (everywhere);
* ``CircuitV2Transport.reserve`` and ``.dial``: reservations and relayed dials;
* ``DCUtRProtocol``: hole punching over a relayed connection (it upgraded one in 2 of 2 runs
  through port-preserving NATs, and gave up cleanly where the NAT randomises ports).

What this module adds around them:

* py-libp2p's swarm drops ``/p2p-circuit`` addresses when it dials a peer, so
  ``host.new_stream`` never goes through a relay by itself. :meth:`RelayClient.connect` dials
  the circuit first; the stream then rides the relayed connection.
* The hop handler is registered only while the node is publicly reachable and the operator
  allows it, with the limits of :class:`RelayLimitsConfig` (circuits, bytes and duration per
  circuit, reservations).
* The hop service serves the mesh, within budgets (:class:`HopGuard`): a reservation is made
  only for the peer actually connected (py-libp2p takes the ``peer`` field of a RESERVE at its
  word, so one connection could fill every slot with made-up ids), only for a peer of this
  mesh, at most ``max_reservations_per_network`` per network and for
  ``reservation_ttl_s``; one source holds at most ``max_circuits_per_source`` of a reserved
  peer's circuits; the duration cap holds on an idle circuit too (py-libp2p checks it only
  when bytes arrive); and a circuit carries only a libp2p connection secured by Noise, the
  mesh's one transport, unless the operator sets ``carry_any``.
* A private node keeps reservations on up to ``reservations`` relays and announces their
  circuit addresses in its NodeInfo.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import trio

from mesh.hopguard import HopGuard

log = logging.getLogger("mesh.relay")

RESERVE_RETRY_S = 10.0
CIRCUIT_RETRY_S = 5.0


@dataclass(frozen=True)
class RelayLimitsConfig:
    """What a public node's relay service gives to others, and what a private node asks for."""

    service: bool = True  # offer the relay service when this node is public
    max_reservations: int = 32  # private peers that may hold a slot here at once
    max_circuits: int = 8  # relayed connections at once to one reserved peer
    max_circuit_bytes: int = 1 << 30  # bytes one circuit may carry, both ways together
    max_circuit_duration_s: int = 3600  # seconds one circuit may stay open
    reservations: int = 2  # relays a private node reserves a slot on
    reservation_ttl_s: int = 900  # how long one reservation lasts; its holder renews it
    max_reservations_per_network: int = 4  # slots for peers of one /24 (IPv6 /48); loopback exempt
    max_circuits_per_source: int = 2  # relayed connections one source may hold to one reserved peer
    carry_any: bool = False  # relay any peer and any bytes, not only this mesh's Noise connections

    def __post_init__(self) -> None:
        for name in ("max_reservations", "max_circuits", "max_circuit_bytes", "max_circuit_duration_s",
                     "max_reservations_per_network", "max_circuits_per_source"):
            if getattr(self, name) < 0:
                raise ValueError(f"relay limit {name} must not be negative")
        if not 0 <= self.reservations <= 8:
            raise ValueError("reservations must be between 0 and 8")
        if not 60 <= self.reservation_ttl_s <= 3600:
            raise ValueError("reservation_ttl_s must be between 60 and 3600 seconds")

    def libp2p_limits(self) -> Any:
        from libp2p.relay.circuit_v2.resources import RelayLimits

        return RelayLimits(duration=self.max_circuit_duration_s, data=self.max_circuit_bytes,
                           max_circuit_conns=self.max_circuits, max_reservations=self.max_reservations,
                           reservation_ttl=self.reservation_ttl_s)


@dataclass
class RelayState:
    """What the node's reachability report shows about relays."""

    reservations: dict[str, float] = field(default_factory=dict)  # relay -> expiry (unix time)
    refused: dict[str, str] = field(default_factory=dict)  # relay -> why it refused us
    hop_enabled: bool = False
    circuits_dialed: int = 0  # relayed connections this node opened
    circuits_served: int = 0  # circuits this node relayed for others
    circuits_now: int = 0
    relayed_bytes: int = 0  # bytes this node relayed for others, both ways


class _KeepNothing(dict[Any, Any]):
    """A table that stores nothing: see ``RelayClient._count_relayed``."""

    def __setitem__(self, key: Any, value: Any) -> None:
        return None


class RelayClient:
    """The relay side of one MeshNode: services, reservations, circuit dials."""

    def __init__(self, host: Any, limits: RelayLimitsConfig,
                 guard: Callable[[Callable[[Any], Any]], Callable[[Any], Any]] | None = None,
                 member: Callable[[str], bool] | None = None) -> None:
        """``guard`` wraps the hop handler in a per-peer stream quota; ``member(peer_id)`` says
        whether a peer belongs to this mesh (only those get a reservation here)."""
        from libp2p.relay.circuit_v2 import CircuitV2Protocol, CircuitV2Transport
        from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole

        self.host = host
        self.limits = limits
        self.state = RelayState()
        # Wraps the hop handler in the node's per-peer stream quota (mesh.inbound).
        self._guard = guard or (lambda handler: handler)
        self.protocol = CircuitV2Protocol(host, limits=limits.libp2p_limits(), allow_hop=False)
        # STOP only: a dial through a relay must not take a reservation there as a side effect.
        self.transport = CircuitV2Transport(host, self.protocol, RelayConfig(roles=RelayRole.STOP))
        self._dcutr: Any = None
        self._count_relayed()
        self.hop_guard = HopGuard(self.protocol, limits, member)
        self._nursery: trio.Nursery | None = None
        self._circuit_failed: dict[str, float] = {}
        self._dialing: dict[str, trio.Event] = {}

    @asynccontextmanager
    async def running(self) -> Any:
        from libp2p.relay.circuit_v2 import DCUtRProtocol
        from libp2p.tools.anyio_service import background_trio_service

        self._dcutr = DCUtRProtocol(self.host)
        async with background_trio_service(self.protocol), background_trio_service(self._dcutr), \
                trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    def _count_relayed(self) -> None:
        """Count circuits and bytes through py-libp2p's hop handler, and close each circuit's
        own streams when it ends.

        py-libp2p 0.8.1 files its live circuits by peer (``_active_relays[peer]``), so when one
        of two circuits from the same source ends, its clean-up closes the *other* circuit's
        streams: measured on the NAT topology, a newcomer that opened three relayed connections
        at once saw all of them drop within five seconds. Here that table keeps nothing, and
        each relaying task closes exactly the two streams it was given."""
        protocol = self.protocol
        relay_data, handle_connect = protocol._relay_data, protocol._handle_connect
        protocol._active_relays = _KeepNothing()
        state = self.state

        async def counted_connect(stream: Any, msg: Any) -> None:
            state.circuits_served += 1
            state.circuits_now += 1
            try:
                await handle_connect(stream, msg)
            finally:
                state.circuits_now -= 1

        async def counted_data(src: Any, dst: Any, peer_id: Any, *args: Any) -> None:
            write = dst.write

            async def counted_write(data: bytes) -> None:
                state.relayed_bytes += len(data)
                await write(data)

            dst.write = counted_write
            try:
                await relay_data(src, dst, peer_id, *args)
            finally:
                with trio.CancelScope(shield=True):
                    await protocol._close_stream(src)
                    await protocol._close_stream(dst)

        self.protocol._handle_connect = counted_connect  # type: ignore[method-assign]
        self.protocol._relay_data = counted_data  # type: ignore[method-assign,assignment]

    # -- the hop service -------------------------------------------------------------------------

    def set_hop(self, enabled: bool) -> None:
        """Offer the relay service (public and allowed) or withdraw it."""
        from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID

        enabled = enabled and self.limits.service and self.limits.max_reservations > 0
        if enabled == self.state.hop_enabled:
            return
        if enabled:
            self.host.set_stream_handler(PROTOCOL_ID, self._guard(self.protocol._handle_hop_stream))
            log.info("offering the relay service (%d reservations, %d circuits per peer, %d MB and %d s per circuit)",
                     self.limits.max_reservations, self.limits.max_circuits,
                     self.limits.max_circuit_bytes >> 20, self.limits.max_circuit_duration_s)
        else:
            self.host.remove_stream_handler(PROTOCOL_ID)
        self.state.hop_enabled = enabled

    def relay_load(self) -> dict[str, int]:
        rm = self.protocol.resource_manager
        self.hop_guard.prune()
        refused = {f"refused_{kind.replace(' ', '_')}": n for kind, n in self.hop_guard.refused.items()}
        return {**refused, "reservations": len(getattr(rm, "_reservations", {}) or {}),
                "circuits_now": self.state.circuits_now,
                "circuits_served": self.state.circuits_served, "relayed_bytes": self.state.relayed_bytes}

    # -- reservations ----------------------------------------------------------------------------

    def reserved(self, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        return sorted(r for r, exp in self.state.reservations.items() if exp > now)

    async def keep_reservations(self, candidates: list[str]) -> None:
        """Hold slots on up to ``reservations`` of ``candidates`` (public relay peers)."""
        from libp2p.peer.id import ID
        from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID

        now = time.time()
        for relay in list(self.state.reservations):
            if self.state.reservations[relay] <= now + 60:
                del self.state.reservations[relay]  # lapsed or about to: take it again below
        for relay in candidates:
            if len(self.reserved()) >= self.limits.reservations:
                return
            if relay in self.state.reservations:
                continue
            pid = ID.from_base58(relay)
            stream = None
            with trio.move_on_after(10):
                try:
                    stream = await self.host.new_stream(pid, [PROTOCOL_ID])
                    ok = await self.transport._make_reservation(stream, pid)
                except Exception as exc:
                    ok = False
                    self.state.refused[relay] = f"{exc.__class__.__name__}: {exc}"[:160]
                finally:
                    if stream is not None:
                        with trio.move_on_after(2):
                            with suppress(Exception):
                                await stream.close()
                if ok:
                    expire = float(self.transport._reservations.get(pid, now + 3600))
                    self.state.reservations[relay] = expire
                    self.state.refused.pop(relay, None)
                    log.info("relay %s holds a reservation for this node until %s", relay[-8:],
                             time.strftime("%H:%M:%S", time.localtime(expire)))
                elif relay not in self.state.refused:
                    self.state.refused[relay] = "refused the reservation (full, or not a relay)"

    def circuit_addrs(self, relay_addrs: Callable[[str], list[str]], me: str) -> list[str]:
        """This node's addresses through each relay that holds a slot for it."""
        out = []
        for relay in self.reserved():
            for base in relay_addrs(relay):
                out.append(f"{base}/p2p/{relay}/p2p-circuit/p2p/{me}")
        return out

    # -- dialing ---------------------------------------------------------------------------------

    async def connect(self, peer: str, circuits: list[str], timeout: float = 10.0) -> bool:
        """Open a relayed connection to ``peer`` through the first of ``circuits`` that works.

        Concurrent callers share one dial; a peer whose circuits all failed is not dialled
        again for ``CIRCUIT_RETRY_S``."""
        from multiaddr import Multiaddr

        if not circuits or time.monotonic() - self._circuit_failed.get(peer, -1e9) < CIRCUIT_RETRY_S:
            return False
        pending = self._dialing.get(peer)
        if pending is not None:
            with trio.move_on_after(timeout):
                await pending.wait()
            return self.connected(peer)
        done = self._dialing[peer] = trio.Event()
        try:
            for text in circuits:
                with trio.move_on_after(timeout):
                    try:
                        await self.transport.dial(Multiaddr(text))
                        self.state.circuits_dialed += 1
                        relay = text.split("/p2p-circuit")[0].rsplit("/p2p/", 1)[-1]
                        log.info("connected to %s through relay %s", peer[-8:], relay[-8:])
                        return True
                    except Exception as exc:
                        log.debug("circuit %s failed: %s", text, exc)
            self._circuit_failed[peer] = time.monotonic()
            return False
        finally:
            done.set()
            self._dialing.pop(peer, None)

    def connected(self, peer: str) -> bool:
        from libp2p.peer.id import ID

        conns = (getattr(self.host.get_network(), "connections", {}) or {}).get(ID.from_base58(peer), [])
        return bool(conns)

    def kind_of_connection(self, peer: str) -> str:
        """``direct``, ``relayed`` or ``none``: how this node is connected to ``peer`` now."""
        from libp2p.peer.id import ID

        from mesh.reachability import direct_ips, is_relayed_only

        pid = ID.from_base58(peer)
        if direct_ips(self.host, pid):
            return "direct"
        return "relayed" if is_relayed_only(self.host, pid) else "none"
