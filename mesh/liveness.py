"""Liveness: SWIM-style failure detection that costs a node the same at 4 peers or 4,000.

A node probes only a bounded set of peers (``LivenessHost.watch_set``: its overlay
neighbours, see ``mesh.overlay``, and the members of the rounds it is in), ``probes``
of them per period in turn, not every peer every period:

1. **Direct probe**: one libp2p ping on a kept-open stream.
2. **Indirect probe**: if that fails, ask ``INDIRECT_HELPERS`` other watched peers to ping
   it (``ping_req``); a network hiccup between two nodes does not condemn a third.
3. **Suspicion**: if nobody reached it, it is ``suspect`` here, and a signed ``liveness``
   rumour says so on gossip. Every node that hears it starts the same timer.
4. **Death**: a suspect not heard from within ``suspicion_s`` is ``down``, and a rumour
   says that too. A node that hears itself suspected or declared dead refutes it with an
   ``alive`` rumour signed by itself, with a higher incarnation (SWIM's refutation), so a
   slow node is not thrown out, and a restarted one (whose incarnation starts from the
   wall clock) comes back at once.

A node also checks, once, every peer it learns of (first contact), and looks at one
``down`` peer a period, so a peer that returns is seen again. Everything runs on trio's
clock: the loop, timers and backoff can be tested under ``trio.testing.MockClock``.

Rumours are bounded (one peer id, a state, an integer) and judged before use: a rumour
never overrides what this node heard from the peer itself within ``suspect_after_s``,
and only the peer itself can say it is alive.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterable
from typing import Any, Protocol

import trio

from mesh.bootstrap import PeerBackoff
from mesh.codec import WireError, register_kind, seal
from mesh.compat import StrEnum
from mesh.framing import read_exactly
from mesh.health import DOWN, SUSPECT, UP, HealthConfig, PeerTable
from mesh.identity import Identity
from mesh.messaging import HandlerTable, Inbound, Rejected, SendError

log = logging.getLogger("mesh.liveness")
PING_PROTOCOL = "/ipfs/ping/1.0.0"
RUMOUR = "liveness"
PING_REQ = "ping_req"
register_kind(RUMOUR, 512)
register_kind(PING_REQ, 512)
#: Watched peers probed each period (``HealthConfig.ping_interval_s``): at least this many,
#: and enough that each is probed every ``KEEP_FRESH_S`` (its ping stream stays open, and a
#: new stream's handshakes are what a loaded machine is slowest at), up to the most.
PROBES_PER_PERIOD, MAX_PROBES_PER_PERIOD, KEEP_FRESH_S = 2, 8, 6.0
#: Peers asked to probe a peer that did not answer this node.
INDIRECT_HELPERS = 2
#: A ping waits this many smoothed round trips (at least ``ping_timeout_s``, at most
#: ``MAX_TIMEOUT_FACTOR`` times it).
RTT_FACTOR, MAX_TIMEOUT_FACTOR = 4.0, 4.0
#: A loop that wakes this late is on a starved machine: for a while after, its failed probes
#: say more about itself than about a peer still connected (Lifeguard's idea); a killed
#: process's connections close at once, so it is still suspected.
LAGGING_S, LAGGING_HOLD_S = 1.0, 10.0
#: Direct-then-indirect rounds, a period apart, before a peer is suspected.
PROBE_ROUNDS = 2
#: Newly learnt peers checked per period, and down peers looked at per period.
FIRST_CONTACTS_PER_PERIOD, DOWN_PER_PERIOD = 8, 2
#: A node announces itself alive this long after start, so a restarted node is up again
#: everywhere without waiting for a probe.
ANNOUNCE_AFTER_S = (2.0, 8.0, 20.0)
#: py-libp2p's ping handler closes a stream that carries no ping for 10 s (its RESP_TIMEOUT);
#: a watched peer may be probed less often, so an older kept stream is replaced.
STREAM_IDLE_S = 8.0
#: Peer ids in a rumour or ping request: base58 multihashes are under 64 characters.
MAX_PEER_ID = 128


class Verdict(StrEnum):
    """What a liveness rumour says of its peer."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DOWN = "down"


class LivenessHost(Protocol):
    """What failure detection uses of its node (``mesh.node.MeshNode``): the transport's
    two verbs, gossip, the peer table and the bounded set of peers to watch."""

    peer_id: str
    identity: Identity
    peers: PeerTable
    handlers: HandlerTable

    def watch_set(self) -> set[str]: ...

    def keep_set(self) -> set[str]: ...

    def connected_ids(self) -> set[str]: ...

    async def open(self, peer: str, protocol: str, timeout: float) -> Any: ...

    async def request(self, peer: str, frame: bytes, payload: bytes | None = None,
                      timeout: float = 30.0) -> Any: ...

    async def broadcast(self, frame: bytes) -> int: ...

    async def send_direct(self, frame: bytes, peers: list[str]) -> int: ...

    async def redial(self, peer: str) -> bool: ...


class Liveness:
    def __init__(self, node: LivenessHost, config: HealthConfig, probes: int = PROBES_PER_PERIOD) -> None:
        self.node, self.config, self.probes = node, config, probes
        # Starts at the wall clock in ms: a restarted node outranks what was said of its last life.
        self.incarnation = int(time.time() * 1000)
        self.known: dict[str, int] = {}  # peer -> highest incarnation heard of it
        self.suspects: dict[str, float] = {}  # peer -> trio time its suspicion ends in death
        self.backoff = PeerBackoff()
        self._turn: list[str] = []  # watched peers still to probe this turn
        self._down_turn: list[str] = []
        self._down_fresh = False
        self._streams: dict[str, tuple[Any, float]] = {}  # peer -> (ping stream, last used)
        self._redialling: set[str] = set()
        self._pinging: dict[str, _Pending] = {}
        self._probing: set[str] = set()
        self._keep: set[str] = set()  # the node's keep set, as of the last period
        self._kept_since: dict[str, float] = {}  # peer of the keep set -> when it joined it
        self._due_at = math.inf  # when the loop should wake next
        self._lagging_until = -math.inf
        self._nursery: trio.Nursery | None = None
        # Whether to announce this node alive after start (``ANNOUNCE_AFTER_S``): only a node
        # that was in a mesh before can be held suspect or down anywhere; a first-time node is a
        # stranger to every peer, which drops a rumour about a stranger, so announcing it would
        # cost every node D copies of N rumours when a mesh of N starts, and change nothing.
        self.announce_start = True
        node.handlers.register(RUMOUR, self._on_rumour)
        node.handlers.register(PING_REQ, self._on_ping_req)

    @property
    def suspicion_s(self) -> float:
        return self.config.down_after_s - self.config.suspect_after_s

    async def run(self) -> None:
        started = trio.current_time()
        announce = list(ANNOUNCE_AFTER_S) if self.announce_start else []
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                woke = trio.current_time()
                if woke - self._due_at > LAGGING_S:
                    self._lagging_until = woke + LAGGING_HOLD_S
                self._due_at = woke + self.config.ping_interval_s
                # Probes run beside the loop: a slow one never holds up the next period's, nor
                # the suspicions that are due.
                for peer in self.due():
                    if peer not in self._probing:
                        nursery.start_soon(self.probe, peer)
                self.expire()
                if announce and trio.current_time() - started >= announce[0] and self.node.peers.alive():
                    announce.pop(0)
                    await self._say(self.node.peer_id, Verdict.ALIVE, self.incarnation)
                await trio.sleep(self.config.ping_interval_s)

    # -- one period --------------------------------------------------------------------------

    def due(self) -> list[str]:
        """The peers to probe this period: ``probes`` watched ones in turn, first contacts,
        and a down one."""
        peers = self.node.peers
        self._keep = self.node.keep_set()
        watched = sorted(p for p in self.node.watch_set() if p in peers and p != self.node.peer_id)
        live = [p for p in watched if peers.get(p).state != DOWN]  # type: ignore[union-attr]
        self._turn = [p for p in self._turn if p in live]
        out: list[str] = []
        count = min(MAX_PROBES_PER_PERIOD, max(self.probes, math.ceil(
            len(live) * self.config.ping_interval_s / KEEP_FRESH_S)))
        while len(out) < min(count, len(live)):
            if not self._turn:
                self._turn = [p for p in live if p not in out]
                if not self._turn:
                    break
            out.append(self._turn.pop(0))
        # First contact only with the peers this node keeps (``keep_set``): every other member is
        # known by hearsay, so a new mesh of N does not cost N first contacts on every node.
        fresh = sorted(p for p in self._keep if (r := peers.get(p)) is not None
                       and r.last_seen is None and r.state != DOWN)
        out += [p for p in fresh if p not in out][:FIRST_CONTACTS_PER_PERIOD]
        # Down peers in turn, DOWN_PER_PERIOD a period: the list is taken afresh only once a
        # turn is through, so a period costs the same whatever the size of the table.
        looked = 0
        while looked < DOWN_PER_PERIOD:
            if not self._down_turn:
                self._down_turn = peers.ids(DOWN) if not self._down_fresh else []
                self._down_fresh = True  # at most one new list a period
                if not self._down_turn:
                    break
            peer = self._down_turn.pop(0)
            rec = peers.get(peer)
            if rec is not None and rec.state == DOWN and peer not in out:
                out.append(peer)
                looked += 1
        self._down_fresh = False
        return out

    async def sweep(self) -> None:
        """One period, waiting for its probes and for the deaths it announces."""
        async with trio.open_nursery() as sweep:
            for peer in self.due():
                sweep.start_soon(self.probe, peer)
        for peer in self.expire():
            await self._say(peer, Verdict.DOWN, self.known.get(peer, 0))

    def expire(self) -> list[str]:
        """Suspects whose time is up are down; returns them (announced in the background
        when running). Peers of the keep set never reached age by silence (``_age_unseen``)."""
        now = trio.current_time()
        dead = []
        for peer in [p for p, ends in self.suspects.items() if now >= ends]:
            del self.suspects[peer]
            rec = self.node.peers.get(peer)
            if rec is not None and rec.state == SUSPECT:
                self.node.peers.set_state(peer, DOWN)
                dead.append(peer)
                if self._nursery is not None:
                    self._nursery.start_soon(self._say, peer, Verdict.DOWN, self.known.get(peer, 0))
        self._age_unseen(now)
        return [] if self._nursery is not None else dead

    def _age_unseen(self, now: float) -> None:
        """Peers of the keep set this node never reached are ``suspect``, then ``down``, here
        (no rumour: others may reach them) by silence counted from when they joined the keep
        set, so a member known by hearsay for long is not condemned before its first contact."""
        since = {p: self._kept_since.get(p, now) for p in self._keep}
        self._kept_since = since
        for peer, at in since.items():
            rec = self.node.peers.get(peer)
            if rec is None or rec.last_seen is not None:
                continue
            silent = now - max(at, rec.first_seen)
            if silent >= self.config.down_after_s:
                self.node.peers.set_state(peer, DOWN)
            elif silent >= self.config.suspect_after_s and rec.state != DOWN:
                self.node.peers.set_state(peer, SUSPECT)

    async def probe(self, peer: str) -> bool:
        """Direct, then indirect, twice a period apart; suspicion (and a rumour) if nobody
        reached ``peer`` either time: one slow moment of a loaded machine condemns nobody."""
        self._probing.add(peer)
        try:
            for attempt in range(PROBE_ROUNDS):
                rec = self.node.peers.get(peer)
                if rec is None:
                    return False
                was_down = rec.state == DOWN and rec.last_seen is not None
                if await self.ping(peer):
                    if was_down and self._nursery is not None:
                        # Alive, though taken for dead: tell it, so that it refutes everywhere.
                        self._nursery.start_soon(self._tell, peer)
                    return True
                if rec.last_seen is None or rec.state == DOWN:
                    return False  # never reached, or already dead: silence ages it (``_age_unseen``)
                if await self._ask_others(peer):
                    self.node.peers.seen(peer)
                    return True
                if attempt + 1 < PROBE_ROUNDS:
                    await trio.sleep(self.config.ping_interval_s)
            if self.heard_lately(peer):
                return False  # it spoke (a message, another's ping request) while we probed
            if trio.current_time() < self._lagging_until and peer in self.node.connected_ids():
                return False  # this node runs late, and the peer's connection is open: slow, not gone
            await self.suspect(peer)
            return False
        finally:
            self._probing.discard(peer)

    async def ping(self, peer: str) -> bool:
        """One libp2p ping on a kept-open stream, so the RTT is the network's, not a handshake's;
        a peer with no connection is redialled first (``redial``, with backoff). Pings of one
        peer never overlap (a probe and a ``ping_req`` would interleave on the stream): a
        second one waits for the first's answer."""
        pending = self._pinging.get(peer)
        if pending is not None:
            await pending.done.wait()
            return pending.ok
        pending = self._pinging[peer] = _Pending()
        try:
            pending.ok = await self._ping(peer)
        finally:
            del self._pinging[peer]
            pending.done.set()
        return pending.ok

    async def _ping(self, peer: str) -> bool:
        kept = self._streams.get(peer)
        if kept is not None and trio.current_time() - kept[1] > STREAM_IDLE_S:
            del self._streams[peer]  # the peer's handler has given up on it by now
            if self._nursery is not None:
                self._nursery.start_soon(_reset, kept[0])
            kept = None
        stream = kept[0] if kept is not None else None
        if stream is None and peer not in self._redialling and self.backoff.ready(peer) \
                and peer not in self.node.connected_ids() and self._nursery is not None:
            self._redialling.add(peer)  # now, not when the task starts: one redial at a time
            self._nursery.start_soon(self.redial, peer)
        # A new stream costs a few round trips more than a ping: it gets its own allowance.
        with trio.move_on_after(self.timeout(peer) * (2 if stream is None else 1)):
            try:
                if stream is None:
                    stream = await self.node.open(peer, PING_PROTOCOL, self.config.ping_timeout_s)
                payload = os.urandom(32)
                t0 = trio.current_time()
                self._streams[peer] = (stream, t0)
                await stream.write(payload)
                if await read_exactly(stream, 32) == payload:
                    self.node.peers.reached(peer, (trio.current_time() - t0) * 1000)
                    self.suspects.pop(peer, None)
                    return True
            except Exception as exc:  # a dead peer's stream fails in any of py-libp2p's roots
                log.debug("ping %s failed: %s", peer[-8:], exc)
        dropped = self._streams.pop(peer, None)
        if dropped is not None and self._nursery is not None:
            self._nursery.start_soon(_reset, dropped[0])
        return False

    def timeout(self, peer: str) -> float:
        """A ping's timeout: ``ping_timeout_s``, or ``RTT_FACTOR`` times the peer's smoothed
        round trip where that is longer (as TCP's retransmit timeout follows its RTT), up to
        ``MAX_TIMEOUT_FACTOR`` times the setting: a loaded machine answers slowly, not never."""
        rec = self.node.peers.get(peer)
        rtt_s = (rec.rtt_ms or 0.0) / 1000 if rec is not None else 0.0
        base = self.config.ping_timeout_s
        return min(base * MAX_TIMEOUT_FACTOR, max(base, RTT_FACTOR * rtt_s))

    async def redial(self, peer: str) -> None:
        """One redial of ``peer`` at a time, spaced by ``PeerBackoff`` after failures."""
        self._redialling.add(peer)
        try:
            if await self.node.redial(peer):
                self.backoff.ok(peer)
                self.node.peers.reached(peer)
            else:
                self.backoff.failed(peer)
        finally:
            self._redialling.discard(peer)

    async def _ask_others(self, peer: str) -> bool:
        helpers = [p for p in sorted(self.node.watch_set()) if p != peer and p in set(self.node.peers.alive())]
        if not helpers:
            return False
        frame = seal(self.node.identity, PING_REQ, {"peer": peer})
        reached = False

        async def ask(helper: str) -> None:
            nonlocal reached
            try:
                reply = await self.node.request(helper, frame, timeout=self.timeout(peer) * 3)
            except SendError as exc:
                log.debug("indirect probe of %s via %s failed: %s", peer[-8:], helper[-8:], exc)
                return
            reached = reached or (isinstance(reply, dict) and reply.get("ok") is True)

        async with trio.open_nursery() as nursery:
            for helper in helpers[:INDIRECT_HELPERS]:
                nursery.start_soon(ask, helper)
        return reached

    # -- suspicion and rumours ---------------------------------------------------------------

    async def suspect(self, peer: str) -> None:
        rec = self.node.peers.get(peer)
        if rec is None or rec.state == DOWN or peer in self.suspects:
            return
        log.info("peer %s did not answer this node or %d others: suspect", peer[-8:], INDIRECT_HELPERS)
        self.node.peers.set_state(peer, SUSPECT)
        self.suspects[peer] = trio.current_time() + self.suspicion_s
        await self._say(peer, Verdict.SUSPECT, self.known.get(peer, 0))

    async def _say(self, peer: str, verdict: Verdict, incarnation: int) -> None:
        """Gossip a rumour; one about another peer goes to that peer too, whom the overlay may
        no longer reach (a down peer is nobody's neighbour), so that it can refute it."""
        frame = seal(self.node.identity, RUMOUR, {"peer": peer, "state": str(verdict), "inc": incarnation})
        with trio.move_on_after(self.config.ping_timeout_s * 5):
            await self.node.broadcast(frame)
            if peer != self.node.peer_id:
                await self.node.send_direct(frame, [peer])

    async def _tell(self, peer: str) -> None:
        frame = seal(self.node.identity, RUMOUR, {"peer": peer, "state": str(Verdict.DOWN),
                                                  "inc": self.known.get(peer, 0)})
        with trio.move_on_after(self.config.ping_timeout_s * 5):
            await self.node.send_direct(frame, [peer])

    def heard_lately(self, peer: str) -> bool:
        rec = self.node.peers.get(peer)
        return rec is not None and rec.last_seen is not None and \
            self.node.peers.clock() - rec.last_seen < self.config.suspect_after_s

    async def _on_rumour(self, msg: Inbound) -> None:
        body = msg.envelope.body
        peer, state, inc = (body.get("peer"), body.get("state"), body.get("inc")) if isinstance(body, dict) \
            else (None, None, None)
        if not isinstance(peer, str) or len(peer) > MAX_PEER_ID or not isinstance(inc, int) \
                or isinstance(inc, bool) or not 0 <= inc < 1 << 62 or state not in set(Verdict):
            raise WireError("garbled", "liveness rumour without a peer, a state and an incarnation")
        verdict = Verdict(state)
        if peer == self.node.peer_id:
            if verdict != Verdict.ALIVE and inc >= self.incarnation:
                self.incarnation = inc + 1
            if verdict != Verdict.ALIVE and self._nursery is not None:
                log.info("refuting a rumour that this node is %s", verdict)
                self._nursery.start_soon(self._say, peer, Verdict.ALIVE, self.incarnation)
            return
        rec = self.node.peers.get(peer)
        if rec is None or msg.envelope.sender == self.node.peer_id:
            return  # a stranger (nothing to mark), or this node's own rumour coming back
        if verdict == Verdict.ALIVE:
            if msg.envelope.sender != peer:
                raise WireError("impersonation", "only a peer itself can say it is alive")
            if inc > self.known.get(peer, -1):
                self.known[peer] = inc
                self.suspects.pop(peer, None)
                self.node.peers.set_state(peer, UP)
            return
        if inc < self.known.get(peer, 0) or self.heard_lately(peer) or rec.state == DOWN:
            return  # about an older life, contradicted by what this node heard itself, or moot
        self.known[peer] = max(inc, self.known.get(peer, 0))
        if peer in self.node.connected_ids() and self._nursery is not None:
            # Still connected to it (a killed process's connections close at once): see for
            # ourselves first, so one slow moment somewhere does not take it out everywhere.
            if peer not in self._probing:
                self._nursery.start_soon(self._verify, peer, verdict)
            return
        self._believe(peer, verdict)

    def _believe(self, peer: str, verdict: Verdict) -> None:
        if verdict == Verdict.DOWN:
            self.suspects.pop(peer, None)
            self.node.peers.set_state(peer, DOWN)
        elif peer not in self.suspects:
            self.node.peers.set_state(peer, SUSPECT)
            self.suspects[peer] = trio.current_time() + self.suspicion_s

    async def _verify(self, peer: str, verdict: Verdict) -> None:
        self._probing.add(peer)
        try:
            if not await self.ping(peer) and not self.heard_lately(peer):
                self._believe(peer, verdict)
        finally:
            self._probing.discard(peer)

    async def _on_ping_req(self, msg: Inbound) -> dict[str, bool]:
        body = msg.envelope.body
        peer = body.get("peer") if isinstance(body, dict) else None
        if not isinstance(peer, str) or len(peer) > MAX_PEER_ID:
            raise WireError("garbled", "ping request without a peer")
        if peer not in self.node.peers or peer == self.node.peer_id:
            raise Rejected("not a peer this node knows")
        return {"ok": await self.ping(peer)}

    def forget(self, peers: Iterable[str]) -> None:
        for peer in peers:
            self.known.pop(peer, None)
            self.suspects.pop(peer, None)

    def drop(self, peer: str) -> None:
        """A peer the full peer table evicted: forget it and close its kept ping stream."""
        self.forget([peer])
        dropped = self._streams.pop(peer, None)
        if dropped is not None and self._nursery is not None:
            self._nursery.start_soon(_reset, dropped[0])


class _Pending:
    """One ping in flight, that others wait on."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.ok = False


async def _reset(stream: Any) -> None:
    from mesh.inbound import reset

    await reset(stream)
