"""Peer health: who is up, who is slipping, who is gone.

The table holds every peer this node knows of and its state; who changes a state is
failure detection (``mesh.liveness``): a probe or any valid message makes a peer ``up``, a
probe nobody could answer makes it ``suspect``, and ``down_after_s - suspect_after_s``
later, unless it answered meanwhile, ``down``; rumours from peers do the same, but never
against what this node heard itself within ``suspect_after_s``. Silence alone still ages
the peers this node has never reached (``reevaluate``), against the two thresholds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from mesh.compat import StrEnum
from mesh.peertable import (
    DEFAULT_MAX_PEERS,
    Marks,
    heard_from,
    hint_quota,
    keep_rank,
    stranger,
    stranger_quota,
    victim,
)


class PeerState(StrEnum):
    """A peer's health, from how long ago it was last heard from."""

    UP = "up"
    SUSPECT = "suspect"
    DOWN = "down"


UP, SUSPECT, DOWN = PeerState.UP, PeerState.SUSPECT, PeerState.DOWN


@dataclass(frozen=True)
class HealthConfig:
    ping_interval_s: float = 2.0
    ping_timeout_s: float = 2.0
    suspect_after_s: float = 4.0
    down_after_s: float = 9.0
    penalty_ignore_threshold: float = 10.0
    penalty_ignore_s: float = 60.0
    penalty_decay_per_s: float = 0.05
    max_peers: int = DEFAULT_MAX_PEERS  # entries in the peer table (mesh.peertable)

    def __post_init__(self) -> None:
        if self.max_peers < 1:
            raise ValueError("max_peers must be at least 1")
        if not 0 < self.suspect_after_s < self.down_after_s:
            raise ValueError("thresholds must satisfy 0 < suspect_after_s < down_after_s")
        if self.ping_interval_s <= 0 or self.ping_timeout_s <= 0:
            raise ValueError("ping interval and timeout must be positive")


@dataclass
class PeerRecord:
    peer_id: str
    first_seen: float
    last_seen: float | None = None
    rtt_ms: float | None = None
    state: PeerState = SUSPECT
    addrs: list[str] = field(default_factory=list)
    info: dict[str, Any] | None = None
    penalty: float = 0.0
    penalty_at: float = 0.0
    ignored_until: float = 0.0
    faults: int = 0
    rounds_contributed: int = 0
    reached: bool = False  # this node reached it itself (dialled, pinged, asked): not a stranger
    # Known by hearsay: its own signed record reached this node through another peer
    # (``PeerTable.vouch``), though this node may never have talked to it.
    vouched: bool = False

    def row(self, wall_offset: float = 0.0) -> dict[str, Any]:
        """For people: ``wall_offset`` (``PeerTable.wall_offset``) turns the table's protocol
        clock into wall-clock seconds."""
        return {
            "peer_id": self.peer_id,
            "state": str(self.state),
            "rtt_ms": None if self.rtt_ms is None else round(self.rtt_ms, 3),
            "last_seen": None if self.last_seen is None else self.last_seen + wall_offset,
            "first_seen": self.first_seen + wall_offset,
            "addrs": list(self.addrs),
            "info": self.info,
            "rounds_contributed": self.rounds_contributed,
            "reached": self.reached,
            "penalty": round(self.penalty, 2),
        }


StateListener = Callable[[PeerRecord, PeerState, PeerState], None]
RttListener = Callable[[str, float], None]
EvictListener = Callable[[str], None]


def protocol_clock() -> float:
    """trio's clock inside a trio run (MockClock in tests), the monotonic clock outside one."""
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


class PeerTable:
    """Every peer this node knows of, with its health; pure bookkeeping, no I/O."""

    def __init__(self, config: HealthConfig | None = None, clock: Callable[[], float] = time.time) -> None:
        self.config = config or HealthConfig()
        self.clock = clock
        self._peers: dict[str, PeerRecord] = {}
        self._marks: Marks[PeerRecord] = Marks()  # penalised keys that are not peers (mesh.peertable)
        self._listeners: list[StateListener] = []
        self._evict_listeners: list[EvictListener] = []
        self._rtt_listeners: list[RttListener] = []
        self.evicted = 0
        # Bumped whenever the membership (who is in the table, in which state) changes: what
        # depends on it alone (the overlay, ``mesh.overlay``) is recomputed only then.
        self.version = 0
        self._lists: dict[PeerState, tuple[int, float, list[str]]] = {}  # see ``_listed``

    def on_change(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def on_rtt(self, listener: RttListener) -> None:
        """``listener(peer_id, rtt_ms)`` for every round trip measured (network coordinates)."""
        self._rtt_listeners.append(listener)

    def on_evict(self, listener: EvictListener) -> None:
        """``listener(peer_id)`` when an entry leaves the table: drop what is kept for it."""
        self._evict_listeners.append(listener)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    def get(self, peer_id: str) -> PeerRecord | None:
        return self._peers.get(peer_id)

    def add(self, peer_id: str, addrs: list[str] | None = None, *, displace: bool = True) -> PeerRecord:
        """The entry of a peer this node was told of (with addresses, or to look up). In a
        full table of live peers a new one is not kept: the record returned is detached; nor
        is it, without ``displace``, once the hints fill their quota (a name looked up only
        while there is room, so names that come and go do not churn the table)."""
        rec = self._peers.get(peer_id) or self._admit(peer_id, heard=False, displace=displace)
        if addrs:
            rec.addrs = sorted(set(addrs))
        return rec

    def _admit(self, peer_id: str, heard: bool, displace: bool = True, reached: bool = False) -> PeerRecord:
        """A new entry, in place of the one worth least (``peertable.victim``) when full; a
        hint past the hints' quota, or a stranger past the strangers', in place of one of its kind."""
        rec = self._marks.pop(peer_id) or PeerRecord(peer_id=peer_id, first_seen=self.clock())
        heard, reached = heard or heard_from(rec), reached or rec.reached  # a mark remembers both
        quota = stranger_quota(self.config.max_peers) if heard else hint_quota(self.config.max_peers)
        # A table with fewer entries than the quota cannot hold that many of a kind: the walk
        # that counts them (every entry, at every admission of a mesh that is joining) is skipped.
        kind: list[PeerRecord] = []
        if len(self._peers) >= quota:
            if not heard:
                kind = [r for r in self._peers.values() if not heard_from(r)]
            elif not reached:
                kind = [r for r in self._peers.values() if stranger(r)]
        if len(kind) >= quota:
            if not displace:
                if rec.penalty > 0:
                    self._marks.put(rec)
                return rec
            self._evict(min(kind, key=keep_rank))
        elif len(self._peers) >= self.config.max_peers:
            out = victim(self._peers.values(), newcomer_heard=heard, newcomer_reached=reached)
            if out is None:
                if rec.penalty > 0:
                    self._marks.put(rec)
                return rec
            self._evict(out)
        self._peers[peer_id] = rec
        self.version += 1
        return rec

    def _evict(self, rec: PeerRecord) -> None:
        del self._peers[rec.peer_id]
        self.evicted += 1
        self.version += 1
        if rec.penalty > 0:
            self._marks.put(rec)  # leaving the table does not clear a penalty
        for listener in self._evict_listeners:
            listener(rec.peer_id)

    def all(self) -> list[PeerRecord]:
        return list(self._peers.values())

    def ids(self, state: PeerState | None = None) -> list[str]:
        return [p.peer_id for p in self._peers.values() if state is None or p.state == state]

    def alive(self) -> list[str]:
        """Peers worth talking to: up, and not being ignored for misbehaviour."""
        return list(self._listed(UP))

    def heard(self) -> list[str]:
        """Peers up, not ignored, that this node heard from itself (a message over the peer's own
        connection, an answer to a probe; ``last_seen``). A member known only by hearsay (its
        signed NodeInfo came through another peer, ``vouch``) is not one: any party holding a
        key can have that spread, with no process behind it. What a node plans with, counts
        toward a quorum or submits a job to reads this; the overlay and gossip read ``alive``."""
        now = self.clock()
        return [p.peer_id for p in self._peers.values()
                if p.state == UP and p.last_seen is not None and p.ignored_until <= now]

    def members(self) -> list[str]:
        """Peers still in the mesh as far as this node knows: not down, not ignored. A suspect
        is a member: it must hear that it is suspected, to refute it (``mesh.liveness``)."""
        return list(self._listed(DOWN))

    def _listed(self, which: PeerState) -> list[str]:
        """``alive`` (``which`` is UP: those up) or ``members`` (DOWN: those not down), kept
        until the table changes (``version``) or an ignored peer's time is up: many loops ask
        every period, and a walk of a table of thousands each time was most of an idle node."""
        now = self.clock()
        cached = self._lists.get(which)
        if cached is not None and cached[0] == self.version and now < cached[1]:
            return cached[2]
        until = math.inf
        out = []
        for p in self._peers.values():
            if p.ignored_until > now:
                until = min(until, p.ignored_until)
            elif (p.state == UP) if which == UP else (p.state != DOWN):
                out.append(p.peer_id)
        self._lists[which] = (self.version, until, out)
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {str(s): 0 for s in PeerState}
        for p in self._peers.values():
            out[str(p.state)] += 1
        out["peers"] = len(self._peers)
        return out

    def seen(self, peer_id: str, rtt_ms: float | None = None) -> None:
        """``peer_id`` sent something over its own authenticated connection: a stranger until
        this node reaches it itself (``reached``); strangers hold a bounded share of the table."""
        rec = self._peers.get(peer_id)
        if rec is None:
            rec = self._admit(peer_id, heard=True, reached=False)
        elif not heard_from(rec) and not rec.reached and rec.rounds_contributed == 0:
            # A hint that connects becomes a stranger: one of its kind makes room past the quota.
            quota = stranger_quota(self.config.max_peers)
            others = [r for r in self._peers.values() if stranger(r)] if len(self._peers) > quota else []
            if len(others) >= quota:
                self._evict(min(others, key=keep_rank))
        self._saw(rec, rtt_ms)

    def reached(self, peer_id: str, rtt_ms: float | None = None) -> None:
        """This node reached ``peer_id`` itself: it dialled it, or the peer answered this node's
        ping or request."""
        rec = self._peers.get(peer_id) or self._admit(peer_id, heard=True, reached=True)
        rec.reached = True
        self._saw(rec, rtt_ms)

    def _saw(self, rec: PeerRecord, rtt_ms: float | None) -> None:
        rec.last_seen = self.clock()
        if rtt_ms is not None:
            rec.rtt_ms = rtt_ms if rec.rtt_ms is None else 0.7 * rec.rtt_ms + 0.3 * rtt_ms
            for rtt_listener in self._rtt_listeners:
                rtt_listener(rec.peer_id, rtt_ms)
        self._set_state(rec, UP)

    def vouch(self, peer_id: str) -> None:
        """``peer_id``'s own signed record (its NodeInfo) came through another peer: a member,
        ``up`` by hearsay until failure detection says otherwise (SWIM's membership), so a
        node need not contact every member of a large mesh to gossip with it. Up by hearsay
        is not ``heard``: plans and quorums count only peers this node heard itself. A peer held ``down``
        stays down: only the peer itself (an answer, its signed ``alive``) brings it back."""
        rec = self._peers.get(peer_id)
        if rec is None:
            return
        rec.vouched = True
        if rec.last_seen is None and rec.state == SUSPECT:
            self._set_state(rec, UP)

    def wall_offset(self) -> float:
        """Add to this table's times to get wall-clock seconds (its clock may be trio's)."""
        return time.time() - self.clock()

    def set_state(self, peer_id: str, state: PeerState) -> None:
        """A verdict from elsewhere than silence: failure detection (``mesh.liveness``)."""
        rec = self._peers.get(peer_id)
        if rec is not None:
            self._set_state(rec, state)

    def reevaluate(self, unseen_only: bool = False, among: set[str] | None = None) -> None:
        """Apply the thresholds to every peer (or to those ``among``); called after each probe
        sweep. With ``unseen_only``, only to peers never heard from and not vouched for:
        failure detection judges the others."""
        now = self.clock()
        records = self._peers.values() if among is None else [r for p in among if (r := self._peers.get(p))]
        for rec in records:
            if unseen_only and (rec.last_seen is not None or rec.vouched):
                continue
            ref = rec.last_seen if rec.last_seen is not None else rec.first_seen
            silent = now - ref
            if silent >= self.config.down_after_s:
                self._set_state(rec, DOWN)
            elif silent >= self.config.suspect_after_s:
                self._set_state(rec, SUSPECT)

    def _set_state(self, rec: PeerRecord, state: PeerState) -> None:
        if rec.state == state:
            return
        old, rec.state = rec.state, state
        self.version += 1
        for listener in self._listeners:
            listener(rec, old, state)

    # -- penalties for bad input ------------------------------------------------------------

    def penalise(self, peer_id: str, points: float = 1.0) -> PeerRecord:
        """Score a fault; past the threshold the peer is ignored for a while. A key that is
        not in the table gets a mark (``peertable.Marks``), not an entry: no probes, no lookups."""
        rec = self._peers.get(peer_id)
        if rec is None:
            rec = self._marks.put(self._marks.get(peer_id) or PeerRecord(peer_id=peer_id, first_seen=self.clock()))
        now = self.clock()
        decayed = max(0.0, rec.penalty - (now - rec.penalty_at) * self.config.penalty_decay_per_s)
        rec.penalty = decayed + points
        rec.penalty_at = now
        rec.faults += 1
        if rec.penalty >= self.config.penalty_ignore_threshold:
            rec.ignored_until = now + self.config.penalty_ignore_s
            self.version += 1
        return rec

    def is_ignored(self, peer_id: str) -> bool:
        rec = self._peers.get(peer_id) or self._marks.get(peer_id)
        return rec is not None and rec.ignored_until > self.clock()
