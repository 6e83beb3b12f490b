"""Peer exchange: learn of peers that the DHT cannot show, from peers that know them.

A node behind NAT runs its DHT in client mode, and Kademlia keeps clients out of routing
tables, so two homes that both joined through one public node would never hear of each other
through the DHT. Every node therefore answers a ``peers_req`` with the signed NodeInfo records
of the peers it sees up, exactly as each peer signed them: the asker checks every signature
and learns the peer's addresses, its reachability and its relay circuits, and can then reach
it through a relay. The answer is bounded (``MAX_PEERS`` records, each within the NodeInfo
size limit), and a record never overrides a newer one from the same signer.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any, Protocol

import trio

from mesh.codec import WireError, open_envelope, register_kind, seal
from mesh.health import PeerTable
from mesh.identity import Identity
from mesh.messaging import Inbound, SendError
from mesh.reachability import Reachability
from mesh.reachability import parse as parse_reachability

log = logging.getLogger("mesh.pex")
PEERS_REQUEST = "peers_req"
register_kind(PEERS_REQUEST, 1024)
MAX_PEERS = 64
YOUNG_S = 30.0  # ask often while this node is new
FAST_S = 2.0
SLOW_S = 20.0
MIN_EVERY_S, MAX_EVERY_S = 1.0, 3600.0  # the periods an operator may choose (``MeshConfig.pex_every_s``)
QUIET_ASKS = 3  # asks in a row that teach nothing before a young node slows down


def young_gap(quiet: int) -> float:
    """The wait before the next ask while this node is young, after ``quiet`` asks in a row
    that taught it nothing while its peer table held still: ``FAST_S`` for the first
    ``QUIET_ASKS`` of them (a mesh still starting: the asked peer may know more in a moment),
    then twice the last gap, up to ``SLOW_S``. Each ask is a stream to two peers and their
    answers; a small mesh that had settled asked 15 times in its first half minute for nothing."""
    if quiet < QUIET_ASKS:
        return FAST_S
    return min(SLOW_S, FAST_S * 2 ** (quiet - QUIET_ASKS + 1))


class PexHost(Protocol):
    """What peer exchange may use of its node (``mesh.node.MeshNode``)."""

    peer_id: str
    identity: Identity
    peers: PeerTable

    async def request(self, peer: str, frame: bytes, payload: bytes | memoryview | None = None,
                      timeout: float = 30.0) -> Any: ...

    def connected_ids(self) -> set[str]: ...


class PeerExchange:
    def __init__(self, node: PexHost, on_info: Callable[[str, dict[str, Any]], None], *,
                 every_s: float = SLOW_S) -> None:
        if not MIN_EVERY_S <= every_s <= MAX_EVERY_S:
            raise ValueError(f"the peer-exchange period must be {MIN_EVERY_S:g}-{MAX_EVERY_S:g} s, not {every_s!r}")
        self.node = node
        self.on_info = on_info
        self.every_s = every_s  # a settled node's period (SLOW_S unless its operator chose)
        self.frames: dict[str, bytes] = {}  # peer -> its latest signed NodeInfo
        # The same records, by their bytes: an answer's records already held are skipped
        # without building a set of the whole table at every answer (N per answer, N² a mesh).
        self._held: dict[bytes, str] = {}

    def remember(self, peer: str, frame: bytes) -> None:
        if peer in self.node.peers:  # kept per peer-table entry, and dropped with it
            self._keep(peer, frame)

    def forget(self, peer: str) -> None:
        """``peer`` left the peer table: its record goes too."""
        old = self.frames.pop(peer, None)
        if old is not None and self._held.get(old) == peer:
            del self._held[old]

    def _keep(self, peer: str, frame: bytes) -> None:
        old = self.frames.get(peer)
        if old is not None and self._held.get(old) == peer:
            del self._held[old]
        self.frames[peer] = frame
        self._held[frame] = peer

    async def answer(self, msg: Inbound) -> list[bytes]:
        """Up to ``MAX_PEERS`` records of peers up here, a random draw each time: in a mesh of
        more, repeated asks (anyone's) then spread the whole membership, not the same 64."""
        alive = set(self.node.peers.alive())
        out = [f for p, f in self.frames.items() if p in alive and p != msg.envelope.sender]
        return random.sample(out, MAX_PEERS) if len(out) > MAX_PEERS else out

    def learn(self, frames: object, source: str) -> int:
        """Take the verified records of an answer; the number of peers new to this node."""
        if not isinstance(frames, list):
            return 0
        new = 0
        for frame in frames[:MAX_PEERS]:
            if not isinstance(frame, bytes) or frame in self._held:  # held: not verified again
                continue
            try:
                env = open_envelope(frame, expect_kind="nodeinfo")
            except WireError as exc:
                log.info("peer exchange from %s: dropped a bad record: %s", source[-8:], exc)
                continue
            body = env.body
            if not isinstance(body, dict) or body.get("peer_id") != env.sender or env.sender == self.node.peer_id:
                continue
            rec = self.node.peers.get(env.sender)
            if rec is not None and rec.info is not None and float(rec.info.get("ts", 0)) >= env.ts:
                continue
            self.on_info(env.sender, body)
            if env.sender in self.node.peers:  # not when a full table turned it away
                new += rec is None
                self._keep(env.sender, frame)
        return new

    async def run(self) -> None:
        started = trio.current_time()
        quiet = 0  # asks in a row that taught nothing, the peer table holding still
        seen = -1  # the peer table's version (membership and states) at the last ask
        while True:
            frame = seal(self.node.identity, PEERS_REQUEST, {})
            learnt = answered = 0
            for peer in self._sources():
                try:
                    reply = await self.node.request(peer, frame, timeout=10)
                except SendError as exc:
                    log.debug("peer exchange with %s failed: %s", peer[-8:], exc)
                    continue
                answered += 1
                added = self.learn(reply, peer)
                learnt += added
                if added:
                    log.info("learnt of %d peer(s) from %s", added, peer[-8:])
            if answered:  # no answer says nothing about news: the pace stays as it was
                quiet = 0 if learnt > 0 or self.node.peers.version != seen else quiet + 1
            seen = self.node.peers.version
            young = trio.current_time() - started < YOUNG_S
            await trio.sleep(min(young_gap(quiet), self.every_s) if young else self.every_s)

    def _sources(self) -> list[str]:
        """Two up peers this node has talked to, public ones first (they meet the most
        peers), drawn at random among those so that asks spread over the mesh. Short of two,
        peers it is connected to whatever their state: a node that joined through one
        overloaded peer, which then answered its probes too late and is held ``down`` here,
        knew no one else and asked no one, and stayed alone in a mesh of 24 (real processes,
        2 cores) while its connection to that peer stayed open."""
        ups = [r for r in self.node.peers.all() if r.state == "up" and r.last_seen is not None]
        random.shuffle(ups)
        ups.sort(key=lambda r: parse_reachability((r.info or {}).get("reachability")) != Reachability.PUBLIC)
        out = [r.peer_id for r in ups[:2]]
        if len(out) < 2:
            rest = list(self.node.connected_ids() - set(out))
            random.shuffle(rest)
            out += rest[: 2 - len(out)]
        return out
