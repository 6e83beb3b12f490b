"""MeshNode: one peer of the mesh, embeddable in any trio program.

It owns the libp2p host and the Kademlia DHT and is the façade of the mesh: the layers above
use its verbs, ``request`` (a direct, acknowledged message with an optional bulk payload),
``broadcast`` (gossip over the overlay), ``send_direct`` (one hop to chosen peers),
``fetch_blob`` (content-addressed download from whoever has it) and ``watch`` (peers whose
failure this node should see first-hand). The work is done beside it, each part declaring in
a Protocol what it uses of the node: ``mesh.liveness`` (SWIM-style failure detection over a
bounded set of peers), ``mesh.discovery`` (DHT walks, NodeInfo), ``mesh.gossip`` (overlay
gossip, large messages pulled), ``mesh.overlay`` (which peers are neighbours), ``mesh.nat``,
``mesh.pex`` and ``mesh.inbound``.

The transport seam. Everything that moves bytes between peers goes through ``open(peer,
protocol, timeout)`` (a new stream: ``write``, ``read``, ``close``, ``reset``) and the stream
handlers set in ``run``; liveness, gossip and the verbs use nothing else of libp2p. A
modelled transport replaces ``host`` and those two, and the DHT (``self.dht``: ``put_value``,
``get_value``, ``provide``, ``find_providers``, ``refresh_routing_table``, ``routing_table``,
``add_peer``), which discovery, NAT and blob lookups read. Still direct users of the libp2p
host, outside that seam: ``mesh.dialer`` (joining and redialling), ``mesh.nat``/``mesh.relay``
(circuits, dial-backs) and ``peer_ip``/``connected_ids``.

    async with MeshNode.start(identity, MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"])) as node:
        print(node.multiaddrs())
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import trio

from mesh import __version__, bulk
from mesh.addressbook import BOOK_FILE, AddressBook
from mesh.blob import BLOB_PROTOCOL, BlobError, BlobIntegrityError, BlobNotFound, BlobStore, receive_blob
from mesh.bootstrap import BootstrapError as BootstrapError  # re-exported: callers catch it here
from mesh.bootstrap import Joiner, JoinPolicy
from mesh.codec import (
    MAX_FRAME,
    ReplayGuard,
    WireError,
    WireReason,
    open_envelope,
    register_kind,
    seal,
)
from mesh.compat import StrEnum
from mesh.discovery import Discovery
from mesh.discovery import best_effort as best_effort  # re-exported: the mesh's one catch-all
from mesh.framing import read_obj, write_frame, write_len64
from mesh.gossip import Gossip
from mesh.health import UP, HealthConfig, PeerRecord, PeerState, PeerTable, protocol_clock
from mesh.host import (
    DEFAULT_LISTEN,
    HostError,
    check_tcp_port_free,
    on_disconnect,
    parse_multiaddr,
    sticky_listen,
)
from mesh.identity import Identity
from mesh.inbound import InboundStreams, close, reset
from mesh.limits import PeerLimits
from mesh.liveness import PING_PROTOCOL, Liveness
from mesh.messaging import (
    GOSSIP_PROTOCOL,
    MSG_PROTOCOL,
    HandlerTable,
    Inbound,
    Rejected,
    SeenCache,
    SendError,
)
from mesh.names import libp2p_id, multiaddr_of, peer_text
from mesh.nat import NatService
from mesh.overlay import neighbours, ring_int
from mesh.pex import PEERS_REQUEST, PeerExchange
from mesh.pex import SLOW_S as PEX_SLOW_S
from mesh.push import PUSH_MIN, push_payload
from mesh.reachability import BEHIND_NAT, Reachability
from mesh.reachability import parse as parse_reachability
from mesh.records import NODEINFO_NS, RecordValidator, nodeinfo_key
from mesh.relay import RelayLimitsConfig
from mesh.streaming import STREAM_PROTOCOL, StreamTable, read_items, send_request, serve_stream
from mesh.transport import Libp2pTransport, Transport
from mesh.vivaldi import Coordinate, from_wire, observe

log = logging.getLogger("mesh.node")
INFO_REQUEST = "info_req"
register_kind(INFO_REQUEST, 1024)

EventSink = Callable[..., None]
#: A provider lookup or announcement: best effort, the caller has other ways to find a blob.
DHT_PROVIDER_S = 5.0
#: Opening a blob stream, before the transfer's own timeout starts to matter.
BLOB_OPEN_S = 10.0
#: The address book takes in what the peer table learnt, and is saved if that changed it,
#: this often: a node killed right after it met the mesh still finds it again.
BOOK_EVERY_S = 2.0
#: Connections outside the keep set idle this long are closed, up to this many every period.
TRIM_IDLE_S, TRIM_PER_PERIOD, TRIM_EVERY_S = 30.0, 16, 5.0
#: NodeInfo given to a peer that asks is signed afresh when older than this (its coordinate moves).
INFO_RESEAL_S = 60.0
#: Seconds the addresses a peer's NodeInfo names stay in the peerstore (refreshed by newer records).
LEARNT_ADDR_TTL_S = 600.0
#: DHT routing-table entries, nearest first, that this node keeps first-hand contact with.
DHT_NEAREST = 8
#: The overlay follows a changed membership at most this often.
OVERLAY_EVERY_S = 2.0
#: The cached overlay is also recomputed this often: an ignored peer's time runs out by the
#: clock, not by a change to the table.
IGNORE_RECHECK_S = 5.0
#: Frames already going out when the node stops get this long to finish (``finishing``).
STOP_GRACE_S = 1.0
#: Peers whose reachability, as their presence last said it, a node remembers (the peer
#: table's size: a few thousand members).
SAID_REACH_PEERS = 4096


class MeshEvent(StrEnum):
    """The events a mesh node reports to its embedder (``on_event``)."""

    NODE_STARTED = "node_started"
    REJECTED = "rejected"
    PEER_UP = "peer_up"
    PEER_SUSPECT = "peer_suspect"
    PEER_DOWN = "peer_down"
    REACHABILITY = "reachability"


class Stage(StrEnum):
    """Where a request is, so that a timeout names the stage that took the time: at a thousand
    nodes a leader's partial once timed out with nothing to say whether routing, opening the
    stream, the upload or the receiver's handler held it."""

    ROUTE = "finding a route"
    OPEN = "dialling and opening a stream"
    SEND = "sending"
    REPLY = "waiting for the reply"


@dataclass
class RequestStage:
    """The stage one request has reached (see ``Stage``)."""

    stage: Stage = Stage.ROUTE


PEER_EVENTS = {PeerState.UP: MeshEvent.PEER_UP, PeerState.SUSPECT: MeshEvent.PEER_SUSPECT,
               PeerState.DOWN: MeshEvent.PEER_DOWN}


@dataclass
class MeshConfig:
    listen: list[str] = field(default_factory=lambda: [DEFAULT_LISTEN])
    announce: list[str] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    client_mode: bool = False
    data_dir: Path | None = None
    health: HealthConfig = field(default_factory=HealthConfig)
    node_info: dict[str, Any] = field(default_factory=dict)
    bootstrap_timeout_s: float = 30.0
    refresh_fast_s: float = 1.0
    # A settled node's DHT walk (reaches up to k = 20 peers); newcomers dial in, peer exchange spreads them.
    refresh_slow_s: float = 300.0
    fast_refresh_period_s: float = 30.0
    max_payload: int = 4 << 30
    gossip_window_s: float = 600.0
    gossip_fanout: int = 3  # unused since gossip follows the overlay (mesh.gossip); kept for embedders
    # Blob bytes over a one-off sealed TCP side channel (mesh.bulk) rather than through libp2p.
    bulk_channel: bool = True
    # The peers this node has met, kept across restarts (mesh.addressbook); None: in
    # <data_dir>/peers.json. A node that has been in a mesh rejoins from it with backoff.
    address_book: Path | None = None
    address_book_size: int = 256
    rejoin_backoff_max_s: float = 60.0
    # How often a settled node asks two peers for the peers they know (mesh.pex); a new node
    # asks every 2 s at first. Each ask is a stream to two peers and their answers.
    pex_every_s: float = PEX_SLOW_S
    # NAT traversal (mesh.nat): relay limits and use, LAN discovery, and a forced verdict
    # ("public", "private") that skips the dial-back checks, for tests and operators who know.
    relay: RelayLimitsConfig = field(default_factory=RelayLimitsConfig)
    mdns: bool = True
    reachability: str | None = None
    info_retry_s: float = 10.0  # NodeInfo of a peer that is not up is looked up this often
    # What one peer may cost this node (mesh.limits, docs/security.md).
    limits: PeerLimits = field(default_factory=PeerLimits)
    # The network below the mesh (mesh.transport): py-libp2p over TCP unless a simulator
    # (mesh.testing.simnet) supplies a modelled one.
    transport: Transport = field(default_factory=Libp2pTransport)


class MeshNode:
    def __init__(self, identity: Identity, config: MeshConfig, on_event: EventSink | None = None) -> None:
        self.identity = identity
        self.config = config
        self.peer_id = identity.peer_id
        self.peers = PeerTable(config.health, clock=protocol_clock)
        self.handlers = HandlerTable()
        self.stream_handlers = StreamTable()
        self.replay = ReplayGuard()
        self.seen = SeenCache()
        data_dir = config.data_dir or Path.cwd() / ".gpuflex-mesh"
        self.blobs = BlobStore(Path(data_dir) / "blobs")
        self.book = AddressBook(config.address_book or Path(data_dir) / BOOK_FILE, identity.peer_id,
                                max_peers=config.address_book_size)
        self.joiner: Joiner | None = None
        self._dialer: Any = None
        self._pinned: dict[str, float] = {}  # peer -> trio time until which it is watched
        self._overlay: tuple[Any, list[str]] = ((None, -math.inf), [])  # ((version, when), neighbours)
        self._bootstrap_ids: set[str] = set()
        self._used: dict[str, float] = {}  # peer -> trio time this node last opened a stream to it, or one ended
        self._in_flight: dict[str, int] = {}  # peer -> streams with it open now, either side's
        self._book_save_failed = False
        self._on_event = on_event or (lambda *a, **k: None)
        self._nursery: trio.Nursery | None = None
        self._stopped = trio.Event()
        self._finishing: set[trio.CancelScope] = set()  # scopes of frames going out (``finishing``)
        self._info_frame: bytes | None = None
        # Kinds every peer is sent directly by its origin and that are never relayed.
        self.direct_only: set[str] = set()
        self.started_at = time.time()
        self.listening_since: float | None = None
        self.host: Any = None
        self.dht: Any = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.bulk_bytes_received = 0
        self.nat = NatService(self)
        self.pex = PeerExchange(self, self._learn_info, every_s=config.pex_every_s)
        self.inbound = InboundStreams(self)
        self.liveness = Liveness(self, config.health)
        self.discovery = Discovery(self)
        self.gossip = Gossip(self)
        # Where this node sits in the network (mesh.vivaldi), and where its peers say they do.
        self.coord = Coordinate()
        self.coords: dict[str, Coordinate] = {}
        # Reachability as peers' own presence states it, most recent last, at most SAID_REACH_PEERS.
        self.said_reach: OrderedDict[str, Reachability] = OrderedDict()
        # peer -> (addresses last put in the peerstore from its NodeInfo, when): a record that
        # names the same ones again (every reseal of it, passed on by peer exchange) is not
        # parsed into multiaddrs again until half their peerstore TTL has gone.
        self._noted_addrs: dict[str, tuple[tuple[str, ...], float]] = {}
        self._info_sealed_at = -math.inf
        self.peers.on_change(self._peer_state_changed)
        self.peers.on_evict(self._forget)
        self.peers.on_rtt(self._observe_rtt)

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def start(
        cls, identity: Identity, config: MeshConfig, on_event: EventSink | None = None
    ) -> AsyncIterator[MeshNode]:
        """Run a node for the duration of the ``async with`` block."""
        node = cls(identity, config, on_event)
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            try:
                yield node
            finally:
                node.stop()

    def stop(self) -> None:
        """Stop serving. What is still going out (``finishing``) gets ``STOP_GRACE_S`` more."""
        self._stopped.set()
        if self._finishing:
            until = trio.current_time() + STOP_GRACE_S
            for scope in self._finishing:
                scope.deadline = min(scope.deadline, until)

    @contextmanager
    def finishing(self) -> Iterator[trio.CancelScope]:
        """Shielded from its caller's cancellation, not from the node's stop. A frame must still
        go out when applying it here ended the job that sent it (the root's last result), but a
        node told to stop waited for such sends until they timed out: 5 s for an offer to a peer
        that was stopping too. Once the node stops they have ``STOP_GRACE_S`` left; check
        ``cancelled_caught`` for whether they finished."""
        scope = trio.CancelScope(shield=True)
        if self._stopped.is_set():
            scope.deadline = trio.current_time() + STOP_GRACE_S
        self._finishing.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._finishing.discard(scope)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``stop()``; reports started once listening and bootstrapped."""
        from libp2p.records.validator import NamespacedValidator

        net = self.config.transport
        if net.uses_sockets:
            for addr in self.config.listen:
                check_tcp_port_free(addr)
        await trio.to_thread.run_sync(self.book.load)
        self.liveness.announce_start = bool(self.book.joined)  # a node back in its mesh says so
        wanted = sticky_listen(self.config.listen, self.book.listen) if net.uses_sockets else self.config.listen
        try:
            self.host = net.build_host(self.identity, wanted, self.config.announce)
        except HostError:
            raise  # already says what is wrong
        except Exception as exc:  # py-libp2p's constructors raise from unrelated roots
            raise HostError(f"could not create the libp2p host: {exc}") from exc
        listen = [parse_multiaddr(a, "listen address") for a in wanted]
        async with self.host.run(listen), trio.open_nursery() as nursery:
            self.book.listening(str(a) for ln in self.host.get_network().listeners.values() for a in ln.get_addrs())
            self._nursery = nursery
            validator = NamespacedValidator({NODEINFO_NS: cast(Any, RecordValidator("nodeinfo"))})
            self.dht = net.build_dht(self.host, self.config.client_mode, validator)
            inbound = self.inbound
            self.host.set_stream_handler(MSG_PROTOCOL, inbound.guard(inbound.handle_msg))
            self.host.set_stream_handler(GOSSIP_PROTOCOL, inbound.guard(inbound.handle_gossip, "gossip_streams"))
            self.host.set_stream_handler(BLOB_PROTOCOL, inbound.guard(inbound.handle_blob, "blob_serves"))
            self.host.set_stream_handler(STREAM_PROTOCOL, inbound.guard(
                partial(serve_stream, self, self.config.limits.read_timeout_s)))
            # Pings are served here, not by py-libp2p: each is word that the peer is alive.
            self.host.set_stream_handler(PING_PROTOCOL, inbound.guard(self.liveness.serve_ping))
            if net.uses_sockets:
                on_disconnect(self.host, self.liveness.lost)
            self.handlers.register(INFO_REQUEST, self._answer_info_request)
            self.handlers.register(PEERS_REQUEST, self.pex.answer)
            async with net.serve_dht(self.dht):
                self.listening_since = time.time()
                await nursery.start(self.nat.run)
                self._info_frame = self._seal_node_info()
                await self._join(nursery)
                nursery.start_soon(self._book_loop)
                nursery.start_soon(self._trim_loop)
                nursery.start_soon(self.discovery.walk_loop)
                nursery.start_soon(self.liveness.run)
                nursery.start_soon(self.discovery.info_loop, self.config.health.ping_interval_s)
                nursery.start_soon(self.discovery.publish_loop)
                nursery.start_soon(self.pex.run)
                self._on_event(MeshEvent.NODE_STARTED, message=f"listening on {', '.join(self.multiaddrs())}")
                task_status.started(self)
                await self._stopped.wait()
                nursery.cancel_scope.cancel()

    # -- addresses and info ------------------------------------------------------------------

    def peer_ip(self, peer: str) -> str | None:
        """The IP ``peer`` is connected from, as the transport saw it (a relayed peer shows its
        relay's), or None with no live connection. Unlike the addresses a peer announces, it
        cannot be made up: what per-network caps count (``mesh.netprefix``)."""
        if self.host is None:
            return None
        try:
            conns = self.host.get_network().get_connections(libp2p_id(peer))
        except Exception:  # an id that does not parse, or a network already closed
            return None
        for conn in conns:
            try:
                remote = conn.muxed_conn.get_remote_address()
            except Exception:  # py-libp2p transports differ in what they support
                continue
            if remote:
                return str(remote[0])
        return None

    def multiaddrs(self) -> list[str]:
        if self.host is None:
            return []
        direct = [f"{a}" if "/p2p/" in str(a) else f"{a}/p2p/{self.peer_id}" for a in self.host.get_addrs()]
        return direct + self.nat.circuit_addrs()

    def node_info(self) -> dict[str, Any]:
        info = {"version": __version__, **self.config.node_info, **self.nat.info()}
        info["peer_id"] = self.peer_id
        info["coord"] = self.coord.wire()
        info["addrs"] = [a if "/p2p-circuit" in a else a.split("/p2p/")[0] for a in self.multiaddrs()]
        info["ts"] = time.time()
        return info

    def claimed_reachability(self, peer: str) -> Reachability:
        """What ``peer`` says of its reachability: in its latest presence (``note_reachability``),
        else in its NodeInfo (``unknown`` without either, or for a word outside the vocabulary).
        Presence comes first-hand every few seconds from the members of this node's jobs; a
        NodeInfo may be one read before the peer's own check ended, or none may be held."""
        said = self.said_reach.get(peer)
        if said is not None:
            return said
        rec = self.peers.get(peer)
        return parse_reachability(((rec.info if rec else None) or {}).get("reachability"))

    def note_reachability(self, peer: str, claim: Reachability | None) -> None:
        """``peer``'s reachability as its own signed presence states it (already parsed)."""
        if claim is None or claim == Reachability.UNKNOWN or peer == self.peer_id:
            return
        self.said_reach.pop(peer, None)
        self.said_reach[peer] = claim
        while len(self.said_reach) > SAID_REACH_PEERS:
            self.said_reach.popitem(last=False)

    # What the inbound handlers (mesh.inbound) read of this node.
    @property
    def limits(self) -> PeerLimits:
        return self.config.limits

    @property
    def max_payload(self) -> int:
        return self.config.max_payload

    @property
    def gossip_window_s(self) -> float:
        return self.config.gossip_window_s

    def rejected(self, peer: str, reason: str, message: str) -> None:
        self._on_event(MeshEvent.REJECTED, peer=peer, reason=reason, message=message)

    def reachability_changed(self, old: str, new: str) -> None:
        """Re-announce at once: peers pick relays and leaders by what NodeInfo says."""
        self._info_frame = self._seal_node_info()
        self.discovery.republish_soon()
        self._on_event(MeshEvent.REACHABILITY, message=f"this node is {new} (was {old})", reachability=new)

    def _seal_node_info(self) -> bytes:
        self._info_sealed_at = protocol_clock()
        return seal(self.identity, "nodeinfo", self.node_info())

    def sealed_info(self) -> bytes:
        """This node's NodeInfo, signed afresh (discovery publishes it)."""
        self._info_frame = self._seal_node_info()
        return self._info_frame

    # -- the bounded set of peers this node talks to and watches ------------------------------

    def neighbours(self) -> list[str]:
        """This node's overlay neighbours among the mesh's members (``mesh.overlay``),
        recomputed only when the membership changed (``PeerTable.version``), and then at most
        every ``OVERLAY_EVERY_S``: every gossip forward and probe period asks, a ring of a
        thousand members costs a sort, and a joining mesh changes every node's view each moment."""
        now = self.peers.clock()
        key = (self.peers.version, int(now // IGNORE_RECHECK_S))
        (old, at), cached = self._overlay
        if old != key and (now - at >= OVERLAY_EVERY_S or not cached):
            self._overlay = ((key, now), neighbours(self.peer_id, self.peers.members()))
        return list(self._overlay[1])

    def watch(self, peers: Iterable[str], for_s: float) -> None:
        """Watch ``peers`` (the members of a round this node is in) for ``for_s`` seconds,
        besides the overlay neighbours: their failure is then detected first-hand."""
        until = trio.current_time() + for_s
        for peer in peers:
            if peer != self.peer_id:
                self._pinned[peer] = max(until, self._pinned.get(peer, 0.0))

    def watch_set(self) -> set[str]:
        now = trio.current_time()
        self._pinned = {p: t for p, t in self._pinned.items() if t > now}
        return set(self.neighbours()) | set(self._pinned)

    def dht_nearest(self) -> list[str]:
        """The ``DHT_NEAREST`` entries of the DHT routing table nearest this node (by ring key,
        ``mesh.overlay``): the peers its Kademlia lookups start from."""
        if self.dht is None:
            return []
        me = ring_int(self.peer_id)
        ids = {peer_text(p) for p in self.dht.routing_table.get_peer_ids()} - {self.peer_id}
        return heapq.nsmallest(DHT_NEAREST, ids, key=lambda p: ring_int(p) ^ me)

    def keep_set(self) -> set[str]:
        """The bounded set of peers this node contacts first-hand and keeps connections to:
        its watched peers (overlay neighbours and round members), its DHT routing table's
        nearest entries and its bootstrap peers. Every other member is known by hearsay
        (``PeerTable.vouch``) and costs nothing until a round or the overlay names it."""
        return self.watch_set() | set(self.dht_nearest()) | self._bootstrap_ids

    async def _answer_info_request(self, msg: Inbound) -> bytes | None:
        if self._info_frame is not None and trio.current_time() - self._info_sealed_at > INFO_RESEAL_S:
            self._info_frame = self._seal_node_info()  # its network coordinate moves
        return self._info_frame

    def note_coord(self, peer: str, value: Coordinate | object) -> None:
        """``peer``'s network coordinate, as its own signed NodeInfo or presence states it
        (parsed already, or as it came off the wire)."""
        coord = value if isinstance(value, Coordinate) else from_wire(value)
        if coord is not None and peer in self.peers and peer != self.peer_id:
            self.coords[peer] = coord

    def _observe_rtt(self, peer: str, rtt_ms: float) -> None:
        remote = self.coords.get(peer)
        if remote is not None:
            self.coord = observe(self.coord, remote, rtt_ms)

    async def fetch_node_info(self, peer: str, timeout: float = 5.0) -> dict[str, Any] | None:
        """NodeInfo of ``peer``: asked of the peer itself, else looked up in the DHT by PeerID."""
        try:
            frame = await self.request(peer, seal(self.identity, INFO_REQUEST, {}), timeout=timeout / 2)
        except SendError:
            return await self.lookup_node_info(peer, timeout / 2)
        return self._open_node_info(peer, frame)

    async def lookup_node_info(self, peer: str, timeout: float = 2.5) -> dict[str, Any] | None:
        """NodeInfo of ``peer`` as the DHT holds it (what the peer last published), without
        opening a stream to the peer: the way to learn that a peer held for unreachable has
        since become reachable (``mesh.nat``'s routes)."""
        frame = await best_effort(f"DHT lookup of NodeInfo for {peer}",
                                  lambda: self.dht.get_value(nodeinfo_key(peer)), timeout)
        return self._open_node_info(peer, frame)

    def _open_node_info(self, peer: str, frame: Any) -> dict[str, Any] | None:
        """The body of ``peer``'s signed NodeInfo ``frame``; None (the sender penalised where the
        frame lies) when it is not one."""
        if not isinstance(frame, bytes):
            return None
        try:
            env = open_envelope(frame, expect_kind="nodeinfo")
        except WireError as exc:
            self.inbound.reject(peer, exc, "nodeinfo")
            return None
        if env.sender != peer or not isinstance(env.body, dict):
            self.inbound.reject(peer, WireError(WireReason.SIGNATURE, "NodeInfo is signed by another peer"), "nodeinfo")
            return None
        self.pex.remember(peer, frame)
        self.note_coord(peer, env.body.get("coord"))
        return env.body

    def _learn_info(self, peer: str, info: dict[str, Any]) -> None:
        """A verified NodeInfo of ``peer`` relayed by another peer (``mesh.pex``)."""
        addrs = [a for a in info.get("addrs", []) if isinstance(a, str) and "/p2p-circuit" not in a][:8]
        rec = self.peers.add(peer, [f"{a}/p2p/{peer}" for a in addrs])
        rec.info = info
        if peer not in self.peers:
            return  # a full table turned it away (mesh.peertable): nothing kept for it anywhere
        self.peers.vouch(peer)
        self.note_coord(peer, info.get("coord"))
        now, noted = trio.current_time(), self._noted_addrs.get(peer)
        if noted is not None and noted[0] == tuple(addrs) and now - noted[1] < LEARNT_ADDR_TTL_S / 2:
            return
        self._noted_addrs[peer] = (tuple(addrs), now)
        try:  # so a dial to it has somewhere to go (a DHT walk would have put them there too)
            self.host.get_peerstore().add_addrs(libp2p_id(peer), [multiaddr_of(a) for a in addrs],
                                                int(LEARNT_ADDR_TTL_S))
        except Exception as exc:  # a peer's claimed addresses may fail multiaddr or libp2p in any way
            log.debug("NodeInfo of %s has addresses this node cannot use: %s", peer[-8:], exc)

    # -- background loops --------------------------------------------------------------------

    async def _join(self, nursery: trio.Nursery) -> None:
        """Dial the bootstrap peers and the address book (mesh.bootstrap); a node that has been
        in a mesh before waits for it with backoff instead of failing."""
        from mesh.dialer import bootstrap_candidates, join_candidates

        boot = bootstrap_candidates(self.config.bootstrap, self.peer_id)
        self._bootstrap_ids = {c.peer_id for c in boot}
        dial = self._dialer = self.config.transport.dialer(self.host)
        policy = JoinPolicy(first_run_timeout_s=self.config.bootstrap_timeout_s,
                            backoff_max_s=max(1.0, self.config.rejoin_backoff_max_s))

        async def dial_peer(peer: str, addr: str) -> None:
            from libp2p.peer.id import ID

            await dial(peer, addr)
            self.peers.reached(peer)
            with trio.move_on_after(5), suppress(Exception):
                await self.dht.add_peer(ID.from_base58(peer))

        def noted(peer: str, addr: str, error: str | None) -> None:
            if error is None:
                self.book.reached(peer, addr)
            else:
                self.book.failed(peer, addr)

        self.joiner = Joiner(
            dial_peer, lambda: join_candidates(boot, self.book, self.connected_ids(), policy.max_candidates),
            lambda: bool(self.connected_ids()), policy, on_event=self._on_event, on_dial=noted)
        await nursery.start(self.joiner.run, bool(self.book.joined))

    def connected_ids(self) -> set[str]:
        return {str(p) for p in self.host.get_connected_peers()} - {self.peer_id}

    @contextmanager
    def in_use(self, peer: str) -> Iterator[None]:
        """A stream with ``peer`` is open (a request of this node's, or a peer's stream its
        handlers serve): the connection is not idle while it lasts, nor for ``TRIM_IDLE_S``
        after. Trimming went by this node's own requests and by when it last heard the peer,
        so a leader closed the connection of a member it knew only by hearsay while the
        member's update was arriving on it; the update went to the next ancestor and the
        leader waited for it until its deadline (round 1 of a 300-node mesh took 42 s, not 4)."""
        self._in_flight[peer] = self._in_flight.get(peer, 0) + 1
        try:
            yield
        finally:  # in flight it is kept by ``_in_flight``; from its end, by ``_used``
            left = self._in_flight.pop(peer, 1) - 1
            if left > 0:
                self._in_flight[peer] = left
            self._used[peer] = trio.current_time()

    def streams_with(self, peer: str) -> int:
        """Requests to ``peer`` and streams from it under way now (``in_use``). A request counts
        from before its stream is open: while it routes, dials and negotiates too."""
        return self._in_flight.get(peer, 0)

    def idle_connections(self) -> list[str]:
        """Connected peers outside the keep set that neither side has used for ``TRIM_IDLE_S``
        and that carry no stream now (``in_use``): a round's member it sent an update to, a peer
        that asked for its NodeInfo once."""
        now = trio.current_time()
        self._used = {p: t for p, t in self._used.items() if now - t < TRIM_IDLE_S}
        keep = self.keep_set() | set(self._used) | set(self._in_flight)
        out = []
        for peer in sorted(self.connected_ids() - keep):
            rec = self.peers.get(peer)
            heard = rec.last_seen if rec is not None and rec.last_seen is not None else -math.inf
            if self.peers.clock() - heard >= TRIM_IDLE_S:
                out.append(peer)
        return out

    async def trim_connections(self) -> int:
        """Close the idle connections (``idle_connections``), at most ``TRIM_PER_PERIOD`` at a
        time: what a node holds open stays bounded by its keep set, not by the mesh."""
        from libp2p.peer.id import ID

        closed = 0
        for peer in self.idle_connections()[:TRIM_PER_PERIOD]:
            with trio.move_on_after(self.config.health.ping_timeout_s):
                try:
                    await self.host.disconnect(ID.from_base58(peer))
                    closed += 1
                except Exception as exc:  # py-libp2p's close raises from unrelated roots
                    log.debug("could not close the connection to %s: %s", peer[-8:], exc)
        return closed

    async def _trim_loop(self) -> None:
        while True:
            await trio.sleep(TRIM_EVERY_S)
            await self.trim_connections()

    async def redial(self, peer: str) -> bool:
        """Reconnect a known peer that has no connection, address by address (mesh.dialer):
        py-libp2p's own dial would try only its oldest stored address, which is stale once the
        peer has restarted on a new port, and would then refuse the peer for 60 s. Liveness
        spaces the redials (``PeerBackoff``)."""
        from mesh.dialer import redial_addrs

        if self._dialer is None:
            return False
        for addr in redial_addrs(self.host, peer, self.book):
            try:
                with trio.fail_after(self.config.health.ping_timeout_s * 2):
                    await self._dialer(peer, addr)
            except Exception as exc:  # py-libp2p dial errors come from unrelated roots
                log.debug("redial of %s at %s failed: %s", peer[-8:], addr, exc)
                self.book.failed(peer, addr)
                continue
            self.book.reached(peer, addr)
            return True
        return False

    async def _book_loop(self) -> None:
        """Copy what the node learns of the peers it keeps (``keep_set``) into the address book,
        and save it when it changed (every ``BOOK_EVERY_S`` at most: a killed node loses at most
        that much)."""
        try:
            while True:
                for rec in [r for p in self.keep_set() if (r := self.peers.get(p)) is not None]:
                    if rec.state == UP and rec.reached:  # a stranger's word is a hint, not a verified peer
                        claimed = rec.info.get("addrs") if isinstance(rec.info, dict) else None
                        self.book.seen(rec.peer_id, claimed if isinstance(claimed, list) else [])
                    if rec.addrs:
                        self.book.hint(rec.peer_id, rec.addrs)
                if self.book.dirty:
                    await self._save_book()
                await trio.sleep(BOOK_EVERY_S)
        finally:
            with trio.CancelScope(shield=True):
                await self._save_book()

    async def _save_book(self) -> None:
        """Save the book; a failure (full disk, read-only home) is logged once until a save
        succeeds again, not every ``BOOK_EVERY_S``: the node keeps serving from memory."""
        try:
            await trio.to_thread.run_sync(self.book.save)
        except OSError as exc:
            if not self._book_save_failed:
                log.warning("could not save the address book (kept in memory, retried): %s", exc)
            self._book_save_failed = True
        else:
            self._book_save_failed = False

    def _forget(self, peer: str) -> None:
        """``peer`` left the full peer table (``mesh.peertable``): drop what is kept for it in
        liveness, discovery and peer exchange. When it was looked up is kept a while longer
        (bounded), so a key that comes and goes (a job's absent member, named again every
        second) is not looked up again each time it returns."""
        self.discovery.forget_info(peer, 4 * self.config.health.max_peers)
        self.pex.forget(peer)
        self.coords.pop(peer, None)
        self._noted_addrs.pop(peer, None)
        self.liveness.drop(peer)

    def _peer_state_changed(self, rec: PeerRecord, old: PeerState, new: PeerState) -> None:
        if new == PeerState.UP and old == PeerState.DOWN:
            rec.info = None  # it may have restarted elsewhere: ask for its NodeInfo (addresses) again
        self._on_event(PEER_EVENTS[new], peer=rec.peer_id, message=f"peer {rec.peer_id[-8:]} is {new}")

    # -- inbound streams (mesh.inbound serves them) ---------------------------------------

    def relay(self, frame: bytes, exclude: set[str], msg_id: bytes) -> None:
        """Pass a gossiped frame on to this node's overlay neighbours, in the background."""
        if self._nursery is not None:
            self._nursery.start_soon(self.gossip.forward, frame, msg_id, exclude)

    # -- outbound ----------------------------------------------------------------------------

    async def open(self, peer: str, protocol: str, timeout: float, at: RequestStage | None = None) -> Any:
        """A new stream to ``peer``: the transport seam (see the module docstring). ``at``
        follows the stages, so that a timeout can say where the time went."""
        self._used[peer] = trio.current_time()
        with trio.fail_after(timeout):
            await self.nat.route(peer, timeout)
            if at is not None:
                at.stage = Stage.OPEN
            return await self.host.new_stream(libp2p_id(peer), [protocol])

    async def request(self, peer: str, frame: bytes, payload: bytes | memoryview | None = None,
                      timeout: float = 30.0) -> Any:
        """Deliver a signed frame (and payload) to ``peer`` and return its handler's reply."""
        if peer == self.peer_id:
            raise SendError("cannot send to self")
        at = RequestStage()
        try:
            with trio.fail_after(timeout), self.in_use(peer):
                stream = await self.open(peer, MSG_PROTOCOL, timeout, at)
                try:
                    at.stage = Stage.SEND
                    await write_frame(stream, frame)
                    size = 0 if payload is None else len(payload)
                    view = memoryview(payload if payload is not None else b"")
                    if size >= PUSH_MIN and self._use_bulk():
                        on_stream = not await push_payload(stream, view)
                    else:
                        await write_len64(stream, size)
                        on_stream = True
                    for start in range(0, size if on_stream else 0, 1 << 20):
                        await stream.write(bytes(view[start : start + (1 << 20)]))
                    self.bytes_sent += len(frame) + size
                    at.stage = Stage.REPLY
                    reply = await read_obj(stream, MAX_FRAME)
                finally:
                    await close(stream)
        except trio.TooSlowError:
            raise SendError(f"peer {peer[-8:]} did not answer within {timeout:.0f}s ({at.stage})") from None
        except (WireError, OSError) as exc:
            raise SendError(f"peer {peer[-8:]}: {exc}") from None
        except Exception as exc:  # the verb's contract: any failure to deliver is a SendError
            raise SendError(f"peer {peer[-8:]}: {exc.__class__.__name__}: {exc}") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            err = reply.get("error", "refused") if isinstance(reply, dict) else "garbled reply"
            raise SendError(f"peer {peer[-8:]} refused the message: {err}")
        self.peers.reached(peer)
        return reply.get("reply")

    async def send_direct(self, frame: bytes, peers: list[str]) -> int:
        """Send a signed frame of a ``direct_only`` kind to ``peers`` alone, not relayed and not
        delivered here: what a job's members tell each other (presence)."""
        with self.finishing():
            return await self.gossip.push_to(frame, peers)
        return 0  # the node stopped first

    @asynccontextmanager
    async def request_stream(self, peer: str, frame: bytes, *, open_timeout: float = 10.0,
                             item_timeout: float = 60.0) -> AsyncIterator[AsyncIterator[Any]]:
        """Send a signed request to ``peer``'s stream handler and iterate its reply items as
        they come (``mesh.streaming``); leaving the block closes the stream, which tells the
        server to stop. SendError if it cannot be opened, StreamBroken if it ends early."""
        if peer == self.peer_id:
            raise SendError("cannot send to self")
        try:
            stream = await self.open(peer, STREAM_PROTOCOL, open_timeout)
            await send_request(stream, frame)
        except trio.TooSlowError:
            raise SendError(f"peer {peer[-8:]} did not take the stream within {open_timeout:.0f}s") from None
        except Exception as exc:  # the verb's contract: any failure to deliver is a SendError
            raise SendError(f"peer {peer[-8:]}: {exc.__class__.__name__}: {exc}") from None
        self.bytes_sent += len(frame)
        try:
            with self.in_use(peer):
                yield read_items(stream, peer, item_timeout)
            self.peers.reached(peer)
        finally:
            with self.finishing():
                await reset(stream)

    async def broadcast(self, frame: bytes) -> int:
        """Flood a signed frame to the mesh; also delivers it to this node's own handler."""
        env = open_envelope(frame)
        self.seen.add(env.msg_id)
        # Apply locally first: a coordinator must hold its own plan before members can answer it.
        try:
            await self.handlers.dispatch(Inbound(env, None, self.peer_id, gossip=True))
        except Rejected as exc:
            log.info("own %s was not applied locally: %s", env.kind, exc)
        # Applying our own frame can end the job and cancel the caller (the root's last result);
        # it must still go out. Each push is bounded by its own timeout, and by the node's stop.
        with self.finishing():
            return await self.gossip.forward(frame, env.msg_id, set(), everyone=env.kind in self.direct_only)
        return 0  # the node stopped first

    # -- blobs -------------------------------------------------------------------------------

    def _use_bulk(self) -> bool:
        return self.config.bulk_channel and not bulk.env_disabled()

    def bulk_host(self) -> str | None:
        """Where this node may open a one-off bulk port: its --listen host, if it runs the channel."""
        if self.nat.reachability() in BEHIND_NAT:
            return None  # nobody off this LAN could dial the port: the bytes stay on the stream
        return bulk.bind_host(self.config.listen) if self._use_bulk() else None

    async def announce_blob(self, digest: str) -> None:
        """Advertise a provider record so any peer can find this blob by hash."""
        await best_effort(f"provide {digest[:12]}", lambda: self.dht.provide(digest), DHT_PROVIDER_S)

    async def fetch_blob(self, digest: str, providers: Sequence[str] = (), timeout: float = 120.0,
                         max_size: int | None = None) -> Path:
        """Download ``digest`` from the first provider that serves the right bytes; a provider
        announcing more than ``max_size`` (what the caller expects, else ``max_payload``) is
        refused before any disk is reserved."""
        if self.blobs.has(digest):
            return self.blobs.path(digest)
        candidates = [p for p in providers if p != self.peer_id]
        if not candidates:
            found = await best_effort(f"find_providers {digest[:12]}",
                                      lambda: self.dht.find_providers(digest, 8), DHT_PROVIDER_S) or []
            candidates += [str(p.peer_id) for p in found if str(p.peer_id) != self.peer_id]
        # Holders that accept connections, or are connected already, first, in the caller's
        # order (a peer this node just synced from may not have its NodeInfo here yet); one
        # behind NAT is reached through its relay.
        connected = self.connected_ids()
        candidates.sort(key=lambda p: p not in connected and self.claimed_reachability(p) != Reachability.PUBLIC)
        errors: list[str] = []
        integrity: list[BlobIntegrityError] = []
        missing = 0
        for peer in candidates:
            if self.peers.is_ignored(peer):
                continue
            try:
                with trio.fail_after(timeout), self.in_use(peer):
                    stream = await self.open(peer, BLOB_PROTOCOL, BLOB_OPEN_S)
                    try:
                        limit = min(self.config.max_payload, max_size or self.config.max_payload)
                        path, via_bulk = await receive_blob(stream, self.blobs, digest, peer, limit,
                                                            use_bulk=self._use_bulk())
                    finally:
                        await close(stream)
                self.bytes_received += path.stat().st_size
                if via_bulk:
                    self.bulk_bytes_received += path.stat().st_size
                self.peers.reached(peer)
                return path
            except BlobIntegrityError as exc:
                self.inbound.reject(peer, WireError(WireReason.HASH, str(exc)), "blob")
                errors.append(str(exc))
                integrity.append(exc)
            except WireError as exc:  # an announced size over the limit, a stalled transfer
                self.inbound.reject(peer, exc, "blob")
                errors.append(str(exc))
            except BlobNotFound as exc:
                errors.append(str(exc))
                missing += 1
            except BlobError as exc:
                errors.append(str(exc))
            except Exception as exc:  # one provider's failure, of any kind, moves on to the next
                errors.append(f"{peer[-8:]}: {exc.__class__.__name__}: {exc}")
        detail = "; ".join(errors) if errors else "no peer has it"
        if missing and missing == len(errors):  # every provider asked answered that it holds none
            raise BlobNotFound(f"could not fetch blob {digest[:16]}…: {detail}")
        if integrity:
            raise BlobIntegrityError(candidates[0], digest, "mismatch") if len(candidates) == 1 else BlobError(
                f"could not fetch blob {digest[:16]}…: {detail}")
        raise BlobError(f"could not fetch blob {digest[:16]}…: {detail}")

    # -- reporting ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "peer_id": self.peer_id,
            "addrs": self.multiaddrs(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "listening_since": self.listening_since,
            "mesh": self.peers.counts(),
            "routing_table": self.dht.get_routing_table_size() if self.dht else 0,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "bulk_bytes_received": self.bulk_bytes_received,
            "nat": self.nat.report(),
            "join": {**(self.joiner.status() if self.joiner else {"state": "joining"}),
                     "known_peers": len(self.book), "address_book": str(self.book.path or "")},
        }
