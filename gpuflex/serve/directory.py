"""Which peers serve which models, how busy they are, and which one a request goes to.

Each serving node gossips a small signed ``serve_load`` every second to the peers it is
connected to (one hop, as presence): its models (name and hash), its batch capacity and its
current load. Its NodeInfo in the DHT carries the models and capacity too, for nodes that
look it up. A request goes to the server with the fewest requests per place in the model's
batch: this node's own requests there, counted live, plus other nodes' by the server's last
announcement (``ServerInfo.requests``), over that model's own batch (``ServerInfo.batch``).
The measured round-trip time only breaks ties (it weighs at most half a request); this node
itself, if it serves the model, has no round trip.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import trio

from gpuflex.serve.settings import NAME_RE

#: An announcement older than this is ignored (three missed beats).
FRESH_S = 3.5
#: A server that failed a request is not chosen again for this long.
FAILED_S = 10.0
MAX_ANNOUNCED = 8
_HASH_RE = re.compile(r"^[0-9a-f]{16,128}$")
#: A round trip of this many ms or more weighs as much as RTT_MAX_REQUESTS queued requests; a
#: shorter one in proportion.
RTT_WEIGHT_MS = 100.0
#: Latency only breaks ties between servers equally loaded: it never outweighs one request. A
#: request that joins a busier batch slows every token of it, and one queued behind a full batch
#: waits a whole generation (seconds), both longer than any round trip on earth; and the mesh's
#: round trip to a throttled or loaded server (hundreds of ms on loopback, measured only as often
#: as the mesh probes it, and stale while the server talks) kept it idle while its neighbours
#: queued: weighed as one full batch, a 4-server run with 12 clients reached 2.57x one server's
#: throughput instead of 3x.
RTT_MAX_REQUESTS = 0.5
#: Requests this node keeps in flight to one peer: below the mesh's streams per peer (16), so
#: a burst here is queued or refused as busy, never reset by the server's stream limit.
IN_FLIGHT_PER_PEER = 12


@dataclass
class ServerInfo:
    models: dict[str, str]  # name -> hash
    capacity: int
    load: int
    at: float  # trio time of the announcement
    sent: int = 0  # requests this node routed there and still waits on
    sent_then: int = 0  # ``sent`` when the announcement arrived (its ``load`` counts those too)
    failed_at: float = -math.inf
    stats: dict[str, float | None] = field(default_factory=dict)  # its figures (STAT_KEYS), for status
    batches: dict[str, int] = field(default_factory=dict)  # model -> its fitted batch (newer nodes say)

    def batch(self, model: str) -> int:
        """The sequences the server decodes at once for ``model``: that model's own batch. Its
        capacity is the sum over all its models, and a node serving three names of one model
        drew 60 % of a two-server model's requests, its other server's batch short most of the
        time (the scale-out benchmark, 12 clients); an older node that does not say counts its
        capacity."""
        return self.batches.get(model) or self.capacity

    def requests(self) -> int:
        """The requests the server holds now, as well as this node can tell: this node's own
        (live) plus the others' (its announced load less this node's requests when the
        announcement arrived). The announced load alone is up to a second old: a server that
        has just finished this node's requests would look busy until it speaks again, and one
        that has just been sent a burst would look idle."""
        return self.sent + max(0, self.load - self.sent_then)


def parse_announcement(body: Any) -> tuple[dict[str, str], int, int]:
    """(models, capacity, load) from a peer's ``serve_load`` body; ValueError when malformed."""
    if not isinstance(body, dict):
        raise ValueError("not a map")
    models, capacity, load = body.get("models"), body.get("capacity"), body.get("load")
    if not isinstance(models, dict) or len(models) > MAX_ANNOUNCED:
        raise ValueError("models must be a map of at most 8 entries")
    for name, digest in models.items():
        if not isinstance(name, str) or not NAME_RE.match(name) or not isinstance(digest, str) \
                or not _HASH_RE.match(digest):
            raise ValueError("a model name or hash is malformed")
    for value in (capacity, load):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1_000_000:
            raise ValueError("capacity and load must be small non-negative integers")
    assert isinstance(capacity, int) and isinstance(load, int)
    return dict(models), max(1, capacity), load


#: The figures a server announces of itself (``gpuflex status``, the dashboard, the portal).
STAT_KEYS = ("rps", "tokens_per_s", "ttft_ms_p50", "latency_ms_p50")
_STAT_MAX = 1e9


def parse_stats(body: Any) -> dict[str, float | None]:
    """The optional ``stats`` of a ``serve_load`` body: each of STAT_KEYS a finite number in
    [0, 1e9] or null; an older node sends none. ValueError when malformed."""
    raw = body.get("stats") if isinstance(body, dict) else None
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > 2 * len(STAT_KEYS):
        raise ValueError("stats must be a small map")
    out: dict[str, float | None] = {}
    for key in STAT_KEYS:
        value = raw.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not 0 <= value <= _STAT_MAX):  # NaN fails the comparison too
            raise ValueError(f"stats {key} must be a number from 0 to 1e9, or null")
        out[key] = None if value is None else float(value)
    return out


def parse_batches(body: Any, models: dict[str, str]) -> dict[str, int]:
    """The optional ``batches`` of a ``serve_load`` body: each announced model's fitted batch,
    a small positive integer; an older node sends none. ValueError when malformed."""
    raw = body.get("batches") if isinstance(body, dict) else None
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not set(raw) <= set(models):
        raise ValueError("batches must map announced models to their batch")
    for value in raw.values():
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1_000_000:
            raise ValueError("a model's batch must be a small positive integer")
    return dict(raw)


@dataclass
class Directory:
    own_id: str
    servers: dict[str, ServerInfo] = field(default_factory=dict)

    def update(self, peer: str, models: dict[str, str], capacity: int, load: int,
               stats: dict[str, float | None] | None = None, batches: dict[str, int] | None = None) -> None:
        old = self.servers.get(peer)
        sent = old.sent if old else 0
        self.servers[peer] = ServerInfo(models, capacity, load, trio.current_time(), sent=sent, sent_then=sent,
                                        failed_at=old.failed_at if old else -math.inf, stats=stats or {},
                                        batches=batches or {})

    def heard(self, peer: str) -> None:
        """``peer`` just streamed part of an answer: it is alive and serving, however late its
        last announcement (a server short of CPU can miss its beats while it decodes, and must
        not drop out of the directory, its queued requests refused as "no node serves")."""
        info = self.servers.get(peer)
        if info is not None:
            info.at = max(info.at, trio.current_time())

    def forget(self, peer: str) -> None:
        self.servers.pop(peer, None)

    def failed(self, peer: str) -> None:
        info = self.servers.get(peer)
        if info is not None:
            info.failed_at = trio.current_time()

    def fresh(self) -> dict[str, ServerInfo]:
        now = trio.current_time()
        return {p: s for p, s in self.servers.items() if p == self.own_id or now - s.at <= FRESH_S}

    def models(self) -> dict[str, dict[str, Any]]:
        """Every model some fresh server announces: its hash(es) and servers."""
        out: dict[str, dict[str, Any]] = {}
        for peer, info in sorted(self.fresh().items()):
            for name, digest in info.models.items():
                row = out.setdefault(name, {"hashes": [], "servers": []})
                if digest not in row["hashes"]:
                    row["hashes"].append(digest)
                row["servers"].append(peer)
        return out

    def server_rows(self, rtt_ms: dict[str, float | None]) -> list[dict[str, Any]]:
        """Each fresh server as status shows it: its models, load and announced figures, and
        this node's own requests in flight there (``in_flight``: what the router counts live)."""
        return [{"peer": peer, "self": peer == self.own_id, "models": sorted(info.models), "load": info.load,
                 "capacity": info.capacity, "in_flight": info.sent,
                 "rtt_ms": None if peer == self.own_id else rtt_ms.get(peer),
                 **{k: info.stats.get(k) for k in STAT_KEYS}}
                for peer, info in sorted(self.fresh().items()) if info.models]

    def candidates(self, model: str, exclude: set[str] = frozenset(),  # type: ignore[assignment]
                   model_hash: str | None = None) -> dict[str, ServerInfo]:
        """Fresh servers of ``model`` (and ``model_hash``, if given) not in ``exclude`` and not
        failed lately, full or not."""
        now = trio.current_time()
        return {peer: info for peer, info in self.fresh().items()
                if peer not in exclude and model in info.models and now - info.failed_at >= FAILED_S
                and (model_hash is None or info.models[model] == model_hash)}

    def has_room(self, peer: str, info: ServerInfo) -> bool:
        """Whether this node may send ``peer`` one more request (its own node always)."""
        return peer == self.own_id or info.sent < IN_FLIGHT_PER_PEER

    def choose(self, model: str, rtt_ms: dict[str, float | None], exclude: set[str] = frozenset(),  # type: ignore[assignment]
               model_hash: str | None = None) -> list[str]:
        """Servers of ``model`` (and ``model_hash``, if given) with room, best first."""
        scored = []
        for peer, info in self.candidates(model, exclude, model_hash).items():
            if not self.has_room(peer, info):
                continue
            rtt = 0.0 if peer == self.own_id else (rtt_ms.get(peer) or RTT_WEIGHT_MS / 2)
            latency = RTT_MAX_REQUESTS * min(1.0, rtt / RTT_WEIGHT_MS)
            scored.append(((info.requests() + latency) / info.batch(model), peer))
        return [peer for _, peer in sorted(scored)]

    def serves(self, model: str) -> bool:
        """Whether any fresh server announces ``model`` (busy or not)."""
        return any(model in info.models for info in self.fresh().values())

    def routed(self, peer: str) -> None:
        info = self.servers.get(peer)
        if info is not None:
            info.sent += 1

    def returned(self, peer: str) -> None:
        info = self.servers.get(peer)
        if info is not None and info.sent > 0:
            info.sent -= 1
