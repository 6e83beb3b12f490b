"""One node's life behind (or in front of) NAT: reachability, relays, hole punching, LAN.

``NatService`` runs beside a :class:`mesh.node.MeshNode` and owns the loops that keep it
reachable:

* every few seconds until there is a verdict, then every minute, it asks up to two peers off
  its LAN for a dial-back (``mesh.reachability``); a private node switches its DHT to client
  mode by itself, a public one back to server mode (unless the operator forced ``--client``);
* a public node offers the relay service (``mesh.relay``); a private one reserves slots on up
  to ``RelayLimitsConfig.reservations`` public relays and announces the circuit addresses;
* before a stream is opened to a peer with no connection, :meth:`route` dials one of the
  peer's announced circuits (py-libp2p's swarm never dials circuits itself); py-libp2p's
  DCUtR then upgrades relayed connections where the NATs allow;
* mDNS finds peers on the LAN (``mesh.lan``).
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any, Protocol

import trio

from mesh.codec import seal
from mesh.messaging import Inbound, Rejected, SendError
from mesh.reachability import (
    DIALBACK,
    SERVER_COOLDOWN_S,
    Reachability,
    ReachabilityState,
    dial_back,
    dial_targets,
    direct_ips,
    explain,
    listen_ports,
    local_networks,
    on_my_lan,
    parse,
)
from mesh.relay import RESERVE_RETRY_S, RelayClient
from mesh.transport import Transport

if TYPE_CHECKING:
    from mesh.health import PeerTable
    from mesh.identity import Identity
    from mesh.inbound import InboundStreams
    from mesh.messaging import HandlerTable
    from mesh.relay import RelayLimitsConfig

log = logging.getLogger("mesh.nat")
FAST_CHECK_S = 3.0
#: How often a node behind NAT checks again (and keeps its relay reservations up): three
#: reservation retries' worth.
NAT_CHECK_S = RESERVE_RETRY_S * 3
#: How often a public node checks again: each check has two peers dial it afresh (a TCP
#: connection, a Noise handshake and identify, at both ends), and at every half minute these
#: were a settled mesh's largest idle cost; a public verdict changes only with the network.
PUBLIC_CHECK_S = 300.0
SERVERS_PER_CHECK = 2
#: A peer whose NodeInfo here says it is behind NAT with no relay is looked up afresh in the
#: DHT at most this often before a stream to it is refused: a home node's record read before
#: its relay reservation came says "private" for up to ``INFO_REFRESH_S``, while the plan that
#: made it a leader was drawn from its newer word.
RECHECK_PRIVATE_S = 10.0
#: Peers whose last such look-up is remembered.
RECHECK_MEMORY = 1024


def circuits_of(info: dict[str, Any]) -> list[str]:
    """The relay circuits a peer's NodeInfo announces (the first four)."""
    return [a for a in info.get("addrs", []) if isinstance(a, str) and "/p2p-circuit/" in a][:4]


class NatSettings(Protocol):
    """The settings NAT traversal reads (``mesh.node.MeshConfig`` has them)."""

    reachability: str | None
    client_mode: bool
    relay: RelayLimitsConfig
    mdns: bool
    listen: list[str]
    announce: list[str]
    transport: Transport


class NatHost(Protocol):
    """What NAT traversal may use of its node (``mesh.node.MeshNode``): the libp2p host and
    DHT it drives, the peer table it reads, and the node's message verbs. Declared here so
    that this module never imports the node."""

    peer_id: str
    identity: Identity
    peers: PeerTable
    handlers: HandlerTable
    inbound: InboundStreams
    host: Any
    dht: Any

    @property
    def config(self) -> NatSettings: ...

    async def request(self, peer: str, frame: bytes, payload: bytes | memoryview | None = None,
                      timeout: float = 30.0) -> Any: ...

    async def lookup_node_info(self, peer: str, timeout: float = 2.5) -> dict[str, Any] | None: ...

    def reachability_changed(self, old: str, new: str) -> None: ...


class NatService:
    def __init__(self, node: NatHost) -> None:
        self.node = node
        self.state = ReachabilityState()
        forced = node.config.reachability
        if forced:
            self.state.forced = Reachability(forced)
        self.relay: RelayClient | None = None
        self.lan: Any = None
        self._served: dict[str, float] = {}
        self._rechecked: dict[str, float] = {}  # peer -> when its NodeInfo was last looked up afresh
        self._lan_nets = local_networks()
        self._verdict = Reachability.UNKNOWN
        self._dht_mode = "client" if node.config.client_mode else "server"

    # -- the node's view ---------------------------------------------------------------------------

    def reachability(self) -> Reachability:
        return self.state.verdict(has_reservation=bool(self.relay and self.relay.reserved()))

    def circuit_addrs(self) -> list[str]:
        if self.relay is None:
            return []
        return self.relay.circuit_addrs(self._relay_base_addrs, self.node.peer_id)

    def info(self) -> dict[str, Any]:
        """Fields this node adds to its NodeInfo."""
        return {"reachability": self.reachability().value,
                "relay_service": bool(self.relay and self.relay.state.hop_enabled),
                "relays": self.relay.reserved() if self.relay else []}

    def report(self) -> dict[str, Any]:
        """The reachability block of ``status`` and ``gpuflex doctor``."""
        relay = self.relay.state if self.relay else None
        return {
            "reachability": self.reachability().value,
            "dht_mode": self._dht_mode,
            "reached_at": self.state.reached_at(),
            "checks": self.state.rows(),
            "relay_service": bool(relay and relay.hop_enabled),
            "relay_load": self.relay.relay_load() if self.relay else {},
            "reservations": self.relay.reserved() if self.relay else [],
            "refused": dict(relay.refused) if relay else {},
            "circuit_addrs": self.circuit_addrs(),
            "lan_peers": sorted(self.lan.found) if self.lan else [],
            "mdns": self.lan is not None,
        }

    def connection(self, peer: str) -> str:
        return self.relay.kind_of_connection(peer) if self.relay else "none"

    def why_unreachable(self, peer: str) -> str:
        rec = self.node.peers.get(peer)
        connected = self.relay.connected(peer) if self.relay else False
        return explain(rec.info if rec else None, rec.state if rec else "down", connected)

    # -- running -----------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from mesh.lan import LanDiscovery, worth_announcing

        self.node.handlers.register(DIALBACK, self._answer_dialback)
        inbound = self.node.inbound
        self.relay = self.node.config.transport.relay_client(
            self.node.host, self.node.config.relay, lambda handler: inbound.guard_plain(handler, "relay_streams"),
            member=self._is_member)
        async with self.relay.running(), trio.open_nursery() as nursery:
            if self.node.config.mdns and worth_announcing(self.node.config.listen):
                self.lan = LanDiscovery(self.node.host, self._lan_peer)
                if not await nursery.start(self.lan.run):
                    self.lan = None
            nursery.start_soon(self._check_loop)
            task_status.started()
            await trio.sleep_forever()

    def _is_member(self, peer: str) -> bool:
        """A peer of this mesh: one whose signed NodeInfo this node holds."""
        rec = self.node.peers.get(peer)
        return rec is not None and bool(rec.info)

    async def _lan_peer(self, peer: str, addrs: list[str]) -> None:
        from libp2p.peer.id import ID
        from libp2p.peer.peerinfo import PeerInfo
        from multiaddr import Multiaddr

        pid = ID.from_base58(peer)
        with trio.fail_after(10):
            await self.node.host.connect(PeerInfo(pid, [Multiaddr(a) for a in addrs]))
        await self.node.dht.add_peer(pid)
        self.node.peers.add(peer, addrs)
        self.node.peers.reached(peer)

    async def _check_loop(self) -> None:
        """Dial-back checks often while the verdict is unknown, every half minute behind NAT
        (which also keeps the relay reservations up) and every 5 min when public; but a private
        node with no relay slot looks for a relay every few seconds, because the public peers'
        NodeInfo (which names the relays) often arrives just after its own first verdict."""
        next_check = 0.0
        while True:
            if trio.current_time() >= next_check:
                if self.state.forced is None:
                    await self.check_once()
                verdict = self.reachability()
                next_check = trio.current_time() + (
                    FAST_CHECK_S if verdict == Reachability.UNKNOWN
                    else PUBLIC_CHECK_S if verdict == Reachability.PUBLIC
                    else NAT_CHECK_S)
            await self._apply()
            seeking = self.reachability() == Reachability.PRIVATE and bool(self.node.config.relay.reservations)
            await trio.sleep(FAST_CHECK_S if seeking else max(FAST_CHECK_S, next_check - trio.current_time()))

    async def _apply(self) -> None:
        """Act on the verdict: DHT mode, relay service, reservations, and a fresh NodeInfo."""
        assert self.relay is not None
        verdict = self.reachability()
        public = verdict == Reachability.PUBLIC
        self.relay.set_hop(public)
        if verdict in (Reachability.PRIVATE, Reachability.RELAYED) and self.node.config.relay.reservations:
            await self.relay.keep_reservations(self._relay_candidates())
            verdict = self.reachability()
        if not self.node.config.client_mode and verdict != Reachability.UNKNOWN:
            await self._set_dht_mode("server" if public else "client")
        if verdict != self._verdict:
            old, self._verdict = self._verdict, verdict
            self.node.reachability_changed(old.value, verdict.value)

    async def _set_dht_mode(self, mode: str) -> None:
        from libp2p.kad_dht.kad_dht import DHTMode

        if mode == self._dht_mode:
            return
        try:
            await self.node.dht.switch_mode(DHTMode.SERVER if mode == "server" else DHTMode.CLIENT)
            self._dht_mode = mode
            # py-libp2p empties the routing table on the switch to client mode; refill it
            # from the live peers (only DHT servers among them are taken).
            from libp2p.peer.id import ID

            for peer in self.node.peers.alive():
                with trio.move_on_after(5):
                    try:
                        await self.node.dht.add_peer(ID.from_base58(peer))
                    except Exception as exc:
                        log.debug("could not re-add %s to the routing table: %s", peer[-8:], exc)
            log.info("DHT %s mode: this node is %s", mode, self.reachability().value)
        except Exception as exc:
            log.warning("could not switch the DHT to %s mode: %s", mode, exc)

    def _relay_candidates(self) -> list[str]:
        """Peers that say they are public and offer the relay service, nearest first."""
        out = []
        for rec in self.node.peers.all():
            info = rec.info or {}
            public = parse(info.get("reachability")) == Reachability.PUBLIC
            if rec.state == "up" and info.get("relay_service") and public:
                out.append((rec.rtt_ms if rec.rtt_ms is not None else 1e9, rec.peer_id))
        return [p for _, p in sorted(out)]

    def _relay_base_addrs(self, relay: str) -> list[str]:
        rec = self.node.peers.get(relay)
        addrs = list((rec.info or {}).get("addrs", [])) if rec else []
        return [a for a in addrs if isinstance(a, str) and "/p2p-circuit" not in a and "/ip4/0.0.0.0/" not in a]

    # -- dial-back: asking ------------------------------------------------------------------------

    def _servers(self) -> list[str]:
        """Peers whose dial-back says something about the internet: directly connected, off
        this node's LAN (a loopback-only mesh counts its loopback peers)."""
        from libp2p.peer.id import ID

        out = []
        for peer in self.node.peers.alive():
            ips = direct_ips(self.node.host, ID.from_base58(peer))
            if ips and not all(on_my_lan(ip, self._lan_nets) for ip in ips):
                out.append(peer)
        random.shuffle(out)
        return out[:SERVERS_PER_CHECK]

    async def check_once(self) -> None:
        own = [str(a) for a in self.node.host.get_addrs()]
        body = {"ports": listen_ports(own), "addrs": list(self.node.config.announce)}
        frame = seal(self.node.identity, DIALBACK, body)

        async def ask(server: str) -> None:
            try:
                reply = await self.node.request(server, frame, timeout=15)
            except SendError as exc:
                log.debug("dial-back request to %s failed: %s", server[-8:], exc)
                return
            if isinstance(reply, dict):
                addr = reply.get("addr")
                self.state.record(server, bool(reply.get("reached")), addr if isinstance(addr, str) else "")

        async with trio.open_nursery() as nursery:
            for server in self._servers():
                nursery.start_soon(ask, server)
        self.state.checked_at = time.time()

    # -- dial-back: answering ---------------------------------------------------------------------

    async def _answer_dialback(self, msg: Inbound) -> dict[str, Any]:
        from libp2p.peer.id import ID

        peer = msg.envelope.sender
        now = trio.current_time()
        if now - self._served.get(peer, -1e9) < SERVER_COOLDOWN_S:
            raise Rejected("dial-back asked again too soon")
        self._served[peer] = now
        if len(self._served) > 1024:
            self._served = {p: t for p, t in self._served.items() if now - t < SERVER_COOLDOWN_S}
        targets = dial_targets(msg.envelope.body, direct_ips(self.node.host, ID.from_base58(peer)))
        reached = await dial_back(self.node.host, peer, targets) if targets else None
        return {"reached": reached is not None, "addr": reached or "", "tried": len(targets)}

    # -- routes to private peers ------------------------------------------------------------------

    async def route(self, peer: str, timeout: float) -> None:
        """Make sure a connection to ``peer`` exists or has been tried through its relays."""
        if self.relay is None or self.relay.connected(peer):
            return
        rec = self.node.peers.get(peer)
        info = rec.info if rec is not None else None
        if not info:
            return
        addrs = [a for a in info.get("addrs", []) if isinstance(a, str)]
        circuits = circuits_of(info)
        claim = parse(info.get("reachability"))
        if circuits and claim != Reachability.PUBLIC:
            await self.relay.connect(peer, circuits, timeout=min(timeout, 10.0))
        elif claim == Reachability.PRIVATE and not any(
                on_my_lan(a.split("/")[2], self._lan_nets) for a in addrs if a.count("/") > 2):
            circuits = await self._fresh_circuits(peer, timeout)
            if circuits:
                await self.relay.connect(peer, circuits, timeout=min(timeout, 10.0))
                return
            # Fail now rather than after a dial timeout: nothing can reach it from here.
            raise SendError(f"peer {peer[-8:]} is {explain(info, rec.state if rec else 'down', False)}")

    async def _fresh_circuits(self, peer: str, timeout: float) -> list[str]:
        """The circuits ``peer`` announces now, by its NodeInfo looked up afresh (at most every
        ``RECHECK_PRIVATE_S`` per peer); kept as the peer's record when it has some."""
        now = trio.current_time()
        if now - self._rechecked.get(peer, -1e18) < RECHECK_PRIVATE_S:
            return []
        self._rechecked.pop(peer, None)
        self._rechecked[peer] = now
        while len(self._rechecked) > RECHECK_MEMORY:
            del self._rechecked[next(iter(self._rechecked))]
        fresh = await self.node.lookup_node_info(peer, min(timeout / 2, 2.5))
        circuits = circuits_of(fresh or {})
        rec = self.node.peers.get(peer)
        if circuits and fresh is not None and rec is not None:
            rec.info = fresh
        return circuits
