"""A modelled network for the mesh: thousands of MeshNodes in one trio program.

``SimNetwork`` implements ``mesh.transport.Transport``: each node gets a ``SimHost`` in place
of py-libp2p's host, a ``SimDHT`` in place of its Kademlia DHT, and a ``SimRelay`` in place of
its relay client. Everything above (liveness, discovery, gossip, NAT routing, the request and
blob verbs, and the product on top) is the production code, unchanged. Run it under
``trio.testing.MockClock(autojump_threshold=0)``: modelled seconds then cost only the CPU
the code itself needs.

What is modelled, and how:

* **Latency**: each node has a position (milliseconds on a plane) and an access delay; the
  one-way delay between two nodes is their distance plus both access delays. A dial costs
  two round trips (TCP, then the Noise handshake); a stream open costs nothing extra, as
  with yamux and optimistic protocol selection.
* **Bandwidth**: each node has an uplink and a downlink; a write is serialised on the
  sender's uplink, travels the link's delay, then is serialised on the receiver's downlink.
  A writer waits for its uplink (back-pressure); the reader gets the bytes when they land.
  Bulk writes queue in order; a small write (a ping, a plan, a notice: ``SPARSE_BYTES``)
  waits at most ``SPARSE_QUEUE_S`` behind them, as a sparse flow does under fq_codel, and
  its bytes still delay the bulk behind it. Bulk flows do not share a link fairly: the
  first queued finishes first.
* **Reachability**: a public node accepts dials; a private one only keeps the connections
  it opened, unless it is ``punchable``: then a peer reaches it through its relay, in one
  more round trip (DCUtR's hole punch). A private, unpunchable node is reached by nobody.
* **Churn**: ``leave`` (the node stops: its connections are reset at once, as by a closing
  process), ``crash`` (it goes silent: dials and writes to it are lost, so peers only learn
  from their own timeouts), and new nodes joining at any time.
* **The DHT**: a global directory with Kademlia's shape, not py-libp2p's code: a node's
  routing table holds the ``K`` peers XOR-nearest to it and a few per distance bucket among
  those it has met; a walk, a put or a get costs ``log2(N)`` request/reply pairs of
  ``DHT_MSG_BYTES``, counted in the traffic figures, and values are found if published.

Traffic is counted per node: writes (messages), bytes, dials, and live connections.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
import time
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from mesh.errors import MeshError
from mesh.identity import Identity
from mesh.names import multiaddr_of

#: Bytes of one modelled DHT request or reply.
DHT_MSG_BYTES = 600
#: Routing-table peers kept per node: Kademlia's k.
K = 20
#: Bits of a modelled DHT key.
KEY_BITS = 64
#: A write shorter than this on the uplink does not make the writer wait (a scheduling
#: shortcut; its bytes still occupy the link).
MIN_WAIT_S = 0.0005
#: A write this small is a sparse flow's: it waits at most ``SPARSE_QUEUE_S`` behind the bulk
#: queued on a link, as under fq_codel (Linux's default queue discipline, and the SQM of home
#: routers), whose round robin serves a flow that builds no queue at once. Queued strictly in
#: order, a 64-byte ping to a root receiving a hundred 10 MB updates waited behind all of them,
#: 80 s at 100 Mbit/s, where TCP's windows and a router's buffer bound it to the standing queue.
SPARSE_BYTES = 16 * 1024
SPARSE_QUEUE_S = 0.05
#: libp2p's ping protocol, which py-libp2p's host serves itself, and its idle-stream timeout.
PING_PROTOCOL, PING_IDLE_S = "/ipfs/ping/1.0.0", 10.0


class SimError(MeshError, OSError):
    """A modelled network failure (refused dial, unreachable peer, reset stream)."""


class StreamEOF(SimError):
    """The far end closed its side (named as py-libp2p's, which ``mesh.framing`` tells by name)."""


class StreamReset(SimError):
    """The stream was reset by either end or by the far node's death."""


class StreamClosed(SimError):
    """A write after this end was closed."""


@dataclass
class LinkModel:
    """One node's place in the modelled network."""

    public: bool = True
    punchable: bool = False  # private, but reachable through a relay and a hole punch
    up_bps: float = 20e6  # bits per second
    down_bps: float = 100e6
    xy: tuple[float, float] = (0.0, 0.0)  # position, in milliseconds of one-way delay
    access_ms: float = 5.0
    speed: float = 1.0  # compute speed factor (read by the trainer stand-in, not the network)

    @property
    def kind(self) -> str:
        """Its reachability in a word, for reports: public, punchable or private."""
        return "public" if self.public else "punchable" if self.punchable else "private"


@dataclass
class Traffic:
    """What one node sent and received, cumulatively."""

    msgs_out: int = 0
    bytes_out: int = 0
    msgs_in: int = 0
    bytes_in: int = 0
    dials: int = 0
    streams: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _queue_start(at: float, free_at: float, sparse: bool) -> float:
    """When a write reaching a link at ``at`` starts on it, the link being busy until
    ``free_at``: after everything queued for a bulk write, after at most ``SPARSE_QUEUE_S`` of
    it for a small one."""
    return max(at, free_at) if not sparse else at + min(max(0.0, free_at - at), SPARSE_QUEUE_S)


class _Pipe:
    """One direction of a stream: chunks with their arrival times, then maybe an EOF."""

    __slots__ = ("chunks", "eof_at", "reset", "waiter")

    def __init__(self) -> None:
        self.chunks: deque[tuple[float, bytes]] = deque()
        self.eof_at: float | None = None
        self.reset = False
        self.waiter: trio.Event | None = None

    def wake(self) -> None:
        if self.waiter is not None:
            self.waiter.set()
            self.waiter = None


class SimConn:
    """A connection as py-libp2p's callers see it: who is at the other end, and from where."""

    def __init__(self, local: SimHost, remote: SimHost, relayed: bool = False) -> None:
        self.local, self.remote, self.relayed = local, remote, relayed
        self.peer_id = remote.pid
        self.muxed_conn = self
        self.streams: set[SimStream] = set()

    def get_remote_address(self) -> tuple[str, int]:
        return (self.remote.ip, 4001)

    def get_transport_addresses(self) -> list[Any]:
        from multiaddr import Multiaddr

        if self.relayed:
            return [Multiaddr(f"/ip4/{self.remote.ip}/tcp/4001/p2p-circuit")]
        return [Multiaddr(f"/ip4/{self.remote.ip}/tcp/4001")]


class SimStream:
    """One end of a modelled stream, with py-libp2p's stream verbs."""

    def __init__(self, net: SimNetwork, conn: SimConn, protocol: str, inbox: _Pipe, outbox: _Pipe) -> None:
        self.net, self.conn, self.protocol = net, conn, protocol
        self.inbox, self.outbox = inbox, outbox
        self.muxed_conn = conn
        self._pending = b""
        conn.streams.add(self)

    def get_protocol(self) -> str:
        return self.protocol

    def get_remote_address(self) -> tuple[str, int]:
        return self.conn.get_remote_address()

    async def read(self, n: int | None = None) -> bytes:
        while True:
            if self.inbox.reset:
                raise StreamReset("stream reset")
            if self._pending:
                out, self._pending = (self._pending, b"") if n is None or n >= len(self._pending) else (
                    self._pending[:n], self._pending[n:])
                return out
            now = trio.current_time()
            if self.inbox.chunks:
                at, data = self.inbox.chunks[0]
                if at > now:
                    await trio.sleep_until(at)
                    continue
                self.inbox.chunks.popleft()
                self._pending = data
                continue
            if self.inbox.eof_at is not None:
                if self.inbox.eof_at > now:
                    await trio.sleep_until(self.inbox.eof_at)
                    continue
                raise StreamEOF("stream closed by the far end")
            waiter = self.inbox.waiter = trio.Event()
            await waiter.wait()

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.outbox.reset or self.inbox.reset:
            raise StreamReset("stream reset")
        if self.outbox.eof_at is not None:
            raise StreamClosed("write after close")
        chunk = bytes(data)
        self.net.writes_by_protocol[self.protocol] += 1
        if self.net.tap is not None:
            self.net.tap(self.conn.remote.peer_id, self.protocol, chunk)
        sent_at, arrive_at = self.net.transmit(self.conn.local, self.conn.remote, len(chunk))
        if arrive_at is not None:
            self.outbox.chunks.append((arrive_at, chunk))
            self.outbox.wake()
        wait = sent_at - trio.current_time()
        if wait > MIN_WAIT_S:
            await trio.sleep(wait)
        else:
            await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        if self.outbox.eof_at is None:
            last = self.outbox.chunks[-1][0] if self.outbox.chunks else 0.0
            self.outbox.eof_at = max(last, trio.current_time() + self.net.delay(self.conn.local, self.conn.remote))
            self.outbox.wake()
        self.conn.streams.discard(self)
        await trio.lowlevel.checkpoint()

    def _reset_now(self) -> None:
        self.inbox.reset = self.outbox.reset = True
        self.inbox.wake()
        self.outbox.wake()
        self.conn.streams.discard(self)

    async def reset(self) -> None:
        self._reset_now()
        await trio.lowlevel.checkpoint()


class _Listener:
    def __init__(self, host: SimHost) -> None:
        self.host = host

    def get_addrs(self) -> list[Any]:
        return [self.host.listen_addr()]


class SimSwarm:
    """The part of py-libp2p's swarm the mesh reads: connections by peer, and listeners."""

    def __init__(self, host: SimHost) -> None:
        self.connections: dict[Any, list[SimConn]] = {}
        self.listeners = {"sim": _Listener(host)}

    def get_connections(self, pid: Any) -> list[SimConn]:
        return list(self.connections.get(pid, []))

    def unblock_peer(self, pid: Any) -> None:
        """py-libp2p's negative dial cache: the model has none."""


class SimHost:
    """One node's host on the modelled network (the part of py-libp2p's IHost the mesh uses)."""

    def __init__(self, net: SimNetwork, identity: Identity, model: LinkModel, ip: str) -> None:
        from libp2p.peer.id import ID
        from libp2p.peer.peerstore import PeerStore

        self.net, self.identity, self.model, self.ip = net, identity, model, ip
        self.peer_id = identity.peer_id
        self.pid = ID.from_base58(identity.peer_id)
        self.peerstore = PeerStore()
        self.swarm = SimSwarm(self)
        self.handlers: dict[str, Callable[[Any], Any]] = {}
        self.online = False
        self.crashed = False
        self._nursery: trio.Nursery | None = None
        self._up_free = 0.0
        self._down_free = 0.0
        self._dialing: dict[str, trio.Event] = {}
        # py-libp2p's host answers pings by itself; so does this one.
        self.handlers[PING_PROTOCOL] = self._echo_pings

    async def _echo_pings(self, stream: SimStream) -> None:
        """py-libp2p's ping handler: echo each 32-byte ping; drop a stream idle for 10 s."""
        try:
            while True:
                data = b""
                with trio.move_on_after(PING_IDLE_S):
                    while len(data) < 32:
                        data += await stream.read(32 - len(data))
                if len(data) < 32:
                    break
                await stream.write(data)
        except SimError:
            pass
        await stream.reset()

    # -- what the mesh calls --------------------------------------------------------------------------

    def get_id(self) -> Any:
        return self.pid

    def get_peerstore(self) -> Any:
        return self.peerstore

    def get_network(self) -> SimSwarm:
        return self.swarm

    def listen_addr(self) -> Any:
        return multiaddr_of(f"/ip4/{self.ip}/tcp/4001")

    def get_addrs(self) -> list[Any]:
        return [multiaddr_of(f"/ip4/{self.ip}/tcp/4001/p2p/{self.peer_id}")]

    def get_connected_peers(self) -> list[Any]:
        return [pid for pid, conns in self.swarm.connections.items() if conns]

    def set_stream_handler(self, protocol: str, handler: Callable[[Any], Any]) -> None:
        self.handlers[str(protocol)] = handler

    def remove_stream_handler(self, protocol: str) -> None:
        self.handlers.pop(str(protocol), None)

    async def connect(self, info: Any) -> None:
        await self.net.dial(self, str(info.peer_id))

    async def disconnect(self, pid: Any) -> None:
        """Close the connection to ``pid`` at both ends, resetting its streams."""
        self.net.hang_up(self, str(pid))
        await trio.lowlevel.checkpoint()

    async def new_stream(self, pid: Any, protocols: Sequence[str]) -> SimStream:
        peer = str(pid)
        conn = self.conn_to(peer)
        if conn is None:
            await self.net.dial(self, peer)
            conn = self.conn_to(peer)
            if conn is None:
                raise SimError(f"no connection to {peer[-8:]}")
        return await self.net.open_stream(conn, str(protocols[0]))

    @asynccontextmanager
    async def run(self, listen: Any = None) -> AsyncIterator[SimHost]:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.online, self.crashed = True, False
            self.net._went_online(self)
            try:
                yield self
            finally:
                self.net.went_offline(self)
                nursery.cancel_scope.cancel()

    # -- the network's side ----------------------------------------------------------------------------

    def conn_to(self, peer: str) -> SimConn | None:
        other = self.net.hosts.get(peer)
        if other is None:
            return None
        conns = self.swarm.connections.get(other.pid)
        return conns[0] if conns else None

    def serve(self, stream: SimStream, protocol: str) -> bool:
        handler = self.handlers.get(protocol)
        if handler is None or self._nursery is None or not self.online:
            return False
        self._nursery.start_soon(handler, stream)
        return True


class SimDHT:
    """A node's view of the modelled DHT (see the module docstring)."""

    def __init__(self, net: SimNetwork, host: SimHost) -> None:
        self.net, self.host = net, host
        self.routing_table = self
        self._table: dict[str, Any] = {}
        self.mode = "server"

    def get_peer_ids(self) -> list[Any]:
        return list(self._table.values())

    def get_routing_table_size(self) -> int:
        return len(self._table)

    async def switch_mode(self, mode: Any) -> None:
        self.mode = "server" if "SERVER" in str(mode).upper() else "client"

    async def add_peer(self, pid: Any) -> None:
        peer = str(pid)
        if peer != self.host.peer_id and peer in self.net.online and len(self._table) < K * 4:
            self._table[peer] = self.net.online[peer].pid

    async def _hops(self) -> None:
        """A lookup's cost: log2(N) request/reply pairs with routing-table peers, in sequence."""
        hops = max(1, math.ceil(math.log2(max(2, len(self.net.online)))) // 2)
        peers = [p for p in self._table if p in self.net.online] or list(self.net.online)[:1]
        for i in range(hops):
            other = self.net.online.get(peers[i % len(peers)])
            if other is None or other is self.host:
                continue
            self.net.count(self.host, other, DHT_MSG_BYTES)
            self.net.count(other, self.host, DHT_MSG_BYTES)
            await trio.sleep(2 * self.net.delay(self.host, other))

    async def refresh_routing_table(self) -> None:
        """A self-lookup: the ``K`` nearest live DHT servers, dialled as Kademlia's walk would."""
        await self._hops()
        for peer in self.net.nearest(self.host.peer_id, K):
            if peer != self.host.peer_id:
                self._table[peer] = self.net.hosts[peer].pid
        for peer in list(self._table):
            if peer not in self.net.online:
                del self._table[peer]

    async def put_value(self, key: Any, value: bytes) -> None:
        await self._hops()
        self.net.values[bytes(key) if not isinstance(key, str) else key.encode()] = value

    async def get_value(self, key: Any) -> bytes | None:
        await self._hops()
        return self.net.values.get(bytes(key) if not isinstance(key, str) else key.encode())

    async def provide(self, key: str) -> None:
        await self._hops()
        self.net.providers[key].add(self.host.peer_id)

    async def find_providers(self, key: str, count: int) -> list[Any]:
        await self._hops()

        @dataclass
        class Found:
            peer_id: Any

        holders = [p for p in self.net.providers.get(key, ()) if p in self.net.online][:count]
        return [Found(self.net.hosts[p].pid) for p in holders]


class SimRelay:
    """The relay client of a node on the modelled network: no reservations to keep; a
    punchable private node announces one circuit, and ``connect`` dials it with a punch."""

    def __init__(self, net: SimNetwork, host: SimHost) -> None:
        self.net, self.host = net, host

        @dataclass
        class State:
            hop_enabled: bool = False
            refused: dict[str, str] = field(default_factory=dict)

        self.state = State()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SimRelay]:
        yield self

    def set_hop(self, enabled: bool) -> None:
        self.state.hop_enabled = enabled

    def relay_load(self) -> dict[str, int]:
        return {}

    def reserved(self, now: float | None = None) -> list[str]:
        return []

    async def keep_reservations(self, candidates: list[str]) -> None:
        await trio.lowlevel.checkpoint()

    def circuit_addrs(self, relay_addrs: Any, me: str) -> list[str]:
        if self.host.model.public or not self.host.model.punchable:
            return []
        return [f"/ip4/{self.net.relay_ip}/tcp/4001/p2p/{me}/p2p-circuit/p2p/{me}"]

    async def connect(self, peer: str, circuits: list[str], timeout: float = 10.0) -> bool:
        with trio.move_on_after(timeout):
            try:
                await self.net.dial(self.host, peer)
                return True
            except SimError:
                return False
        return False

    def connected(self, peer: str) -> bool:
        return self.host.conn_to(peer) is not None

    def kind_of_connection(self, peer: str) -> str:
        conn = self.host.conn_to(peer)
        return "none" if conn is None else ("relayed" if conn.relayed else "direct")


class SimNetwork:
    """The modelled network; also a ``mesh.transport.Transport`` for MeshConfig."""

    uses_sockets = False

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.epoch = time.time()  # the wall clock at modelled time 0 (``gpuflex.testing.sim``)
        self.hosts: dict[str, SimHost] = {}
        self.online: dict[str, SimHost] = {}
        self.models: dict[str, LinkModel] = {}
        self.traffic: dict[str, Traffic] = defaultdict(Traffic)
        self.values: dict[bytes, bytes] = {}
        self.providers: dict[str, set[str]] = defaultdict(set)
        self.relay_ip = "198.18.0.1"
        self.writes_by_protocol: Counter[str] = Counter()
        # Called with (receiver, protocol, bytes) for every write: what a benchmark watches for.
        self.tap: Callable[[str, str, bytes], None] | None = None
        self._ids: dict[str, int] = {}  # peer -> XOR key
        self._online_keys: list[tuple[int, str]] = []  # (XOR key, peer) of online hosts, sorted

    # -- set-up -----------------------------------------------------------------------------------------

    def place(self, peer_id: str, model: LinkModel) -> None:
        """Give ``peer_id`` its place in the network before its node starts."""
        self.models[peer_id] = model

    def _ip(self, index: int) -> str:
        index += 2  # 198.18.0.0/15 is set aside for benchmarks; .0.1 is the modelled relay
        return f"198.{18 + (index >> 16)}.{(index >> 8) & 255}.{index & 255}"

    # -- Transport ----------------------------------------------------------------------------------------

    def build_host(self, identity: Identity, listen: Sequence[str], announce: Sequence[str]) -> SimHost:
        peer = identity.peer_id
        host = self.hosts.get(peer)
        if host is None:
            model = self.models.setdefault(peer, LinkModel())
            host = self.hosts[peer] = SimHost(self, identity, model, self._ip(len(self.hosts)))
            self._ids[peer] = int.from_bytes(hashlib.sha256(peer.encode()).digest()[:8], "big")
        return host

    def build_dht(self, host: SimHost, client_mode: bool, validator: Any) -> SimDHT:
        return SimDHT(self, host)

    @asynccontextmanager
    async def serve_dht(self, dht: Any) -> AsyncIterator[None]:
        yield

    def dialer(self, host: SimHost) -> Callable[[str, str], Any]:
        async def dial(peer: str, addr: str) -> None:
            await self.dial(host, peer)

        return dial

    def relay_client(self, host: SimHost, limits: Any, guard: Any, member: Any = None) -> SimRelay:
        return SimRelay(self, host)

    # -- the model ----------------------------------------------------------------------------------------

    def delay(self, a: SimHost, b: SimHost) -> float:
        (ax, ay), (bx, by) = a.model.xy, b.model.xy
        return (math.hypot(ax - bx, ay - by) + a.model.access_ms + b.model.access_ms) / 1000.0

    def rtt_ms(self, a: str, b: str) -> float:
        return 2000.0 * self.delay(self.hosts[a], self.hosts[b])

    def count(self, src: SimHost, dst: SimHost, size: int) -> None:
        out, inn = self.traffic[src.peer_id], self.traffic[dst.peer_id]
        out.msgs_out += 1
        out.bytes_out += size
        inn.msgs_in += 1
        inn.bytes_in += size

    def transmit(self, src: SimHost, dst: SimHost, size: int) -> tuple[float, float | None]:
        """Occupy the links for ``size`` bytes: (when the sender's uplink is done, when the
        bytes land at ``dst``, or None if they are lost). Bulk writes queue in order on each
        link; a small one (``SPARSE_BYTES``) waits at most ``SPARSE_QUEUE_S`` behind them,
        and its bytes still delay the bulk behind it (see the module docstring)."""
        now = trio.current_time()
        sparse = size <= SPARSE_BYTES
        start = _queue_start(now, src._up_free, sparse)
        sent = start + size * 8 / src.model.up_bps
        src._up_free = max(src._up_free, now) + size * 8 / src.model.up_bps if sparse else sent
        self.count(src, dst, size)
        if not dst.online or dst.crashed:
            return sent, None
        first = start + self.delay(src, dst)
        down_start = _queue_start(first, dst._down_free, sparse)
        landed = down_start + size * 8 / dst.model.down_bps
        dst._down_free = max(dst._down_free, first) + size * 8 / dst.model.down_bps if sparse else landed
        return sent, max(sent + self.delay(src, dst), landed)

    def reachable(self, src: SimHost, dst: SimHost) -> bool:
        return dst.model.public or dst.model.punchable or dst.conn_to(src.peer_id) is not None

    async def dial(self, src: SimHost, peer: str) -> None:
        """Connect ``src`` to ``peer``: two round trips (three with a hole punch), or an error."""
        if src.conn_to(peer) is not None:
            return
        pending = src._dialing.get(peer)
        if pending is not None:
            await pending.wait()
            if src.conn_to(peer) is None:
                raise SimError(f"dial to {peer[-8:]} failed")
            return
        done = src._dialing[peer] = trio.Event()
        try:
            dst = self.hosts.get(peer)
            self.traffic[src.peer_id].dials += 1
            if dst is None or dst.crashed or (dst.online and not self.reachable(src, dst)):
                await trio.sleep_forever()  # a SYN into the void: only the caller's timeout ends it
            assert dst is not None
            rtt = 2 * self.delay(src, dst)
            if not dst.online:
                await trio.sleep(rtt)
                raise SimError(f"connection refused by {peer[-8:]}")
            punched = not dst.model.public and dst.conn_to(src.peer_id) is None
            self.count(src, dst, 300)
            self.count(dst, src, 300)
            await trio.sleep(rtt * (3 if punched else 2))
            if not dst.online or dst.crashed or not src.online:
                raise SimError(f"connection to {peer[-8:]} lost during the handshake")
            if src.conn_to(peer) is None:
                src.swarm.connections[dst.pid] = [SimConn(src, dst, relayed=False)]
                dst.swarm.connections[src.pid] = [SimConn(dst, src, relayed=False)]
                src.peerstore.add_addrs(dst.pid, [dst.listen_addr()], 3600)
        finally:
            done.set()
            src._dialing.pop(peer, None)

    async def open_stream(self, conn: SimConn, protocol: str) -> SimStream:
        src, dst = conn.local, conn.remote
        back = dst.conn_to(src.peer_id)
        if back is None or not dst.online:
            raise StreamReset(f"connection to {dst.peer_id[-8:]} is gone")
        ab, ba = _Pipe(), _Pipe()
        mine = SimStream(self, conn, protocol, inbox=ba, outbox=ab)
        theirs = SimStream(self, back, protocol, inbox=ab, outbox=ba)
        self.traffic[src.peer_id].streams += 1
        if dst.crashed:
            return mine  # it will never answer
        if protocol not in dst.handlers:
            await trio.sleep(2 * self.delay(src, dst))
            mine._reset_now()
            raise SimError(f"{dst.peer_id[-8:]} does not speak {protocol}")
        dst.serve(theirs, protocol)
        return mine

    def went_offline(self, host: SimHost) -> None:
        """``host`` stopped (or was killed): a crashed one just goes silent; a stopped one's
        connections are reset at both ends, as by a closing process."""
        host.online = False
        self._left(host.peer_id)
        for key in list(self.providers):
            self.providers[key].discard(host.peer_id)
        if host.crashed:
            return
        for conns in list(host.swarm.connections.values()):
            for conn in conns:
                for stream in list(conn.streams):
                    stream._reset_now()
                other = conn.remote
                for back in other.swarm.connections.pop(host.pid, []):
                    for stream in list(back.streams):
                        stream._reset_now()
        host.swarm.connections.clear()

    def hang_up(self, host: SimHost, peer: str) -> None:
        """``host`` closes its connection to ``peer``: streams reset, both ends forget it."""
        other = self.hosts.get(peer)
        if other is None:
            return
        for conn in host.swarm.connections.pop(other.pid, []) + other.swarm.connections.pop(host.pid, []):
            for stream in list(conn.streams):
                stream._reset_now()

    def crash(self, peer: str) -> None:
        """Make ``peer`` silent from now on (the caller then cancels its node)."""
        host = self.hosts[peer]
        host.crashed = True

    def forget_crashed(self, peer: str) -> None:
        """Peers' connections to a crashed node stay until they notice; clear its own side."""
        host = self.hosts[peer]
        host.swarm.connections.clear()

    def nearest(self, peer: str, k: int) -> list[str]:
        """The ``k`` online DHT peers XOR-nearest to ``peer``: those sharing the longest key
        prefix with it, which lie in one run of the sorted keys, so a lookup costs a few
        bisections, not a sort of the whole network."""
        me = self._ids[peer]
        keys = self._online_keys
        for shift in range(KEY_BITS + 1):  # widen the shared prefix until it holds k others
            lo_key = (me >> shift) << shift
            lo = bisect.bisect_left(keys, (lo_key, ""))
            hi = bisect.bisect_left(keys, (lo_key + (1 << shift), ""))
            if hi - lo > k or (lo == 0 and hi == len(keys)):
                break
        near = sorted((key ^ me, p) for key, p in keys[lo:hi] if p != peer)
        return [p for _, p in near[:k]]

    def _went_online(self, host: SimHost) -> None:
        self.online[host.peer_id] = host
        bisect.insort(self._online_keys, (self._ids[host.peer_id], host.peer_id))

    def _left(self, peer: str) -> None:
        if self.online.pop(peer, None) is not None:
            entry = (self._ids[peer], peer)
            at = bisect.bisect_left(self._online_keys, entry)
            if at < len(self._online_keys) and self._online_keys[at] == entry:
                del self._online_keys[at]

    def connections(self, peer: str) -> int:
        host = self.hosts.get(peer)
        return 0 if host is None else sum(1 for c in host.swarm.connections.values() if c)

    def totals(self, peers: Iterable[str] | None = None) -> Traffic:
        out = Traffic()
        for peer in (self.traffic if peers is None else peers):
            t = self.traffic.get(peer)
            if t is None:
                continue
            for name, value in t.__dict__.items():
                setattr(out, name, getattr(out, name) + value)
        return out
