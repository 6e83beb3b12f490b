"""Which peers serve which models, how busy they are, and which one a request goes to.

Each serving node gossips a small signed ``serve_load`` every second to the peers it is
connected to (one hop, as presence): its models (name and hash), its batch capacity and its
current load. Its NodeInfo in the DHT carries the models and capacity too, for nodes that
look it up. A request goes to the server with the lowest score, load over capacity plus
the measured round-trip time (100 ms weighs as much as a full batch), counting at least the
requests this node itself has in flight there; this node itself, if it serves the
model, has no round trip.
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
#: A server's round-trip time counts as its share of a full batch per this many ms, and never as
#: more than one full batch: a request queued behind a full batch waits at least one whole
#: generation (seconds), longer than any round trip on earth, and a throttled or loaded server's
#: pings (hundreds of ms on loopback, measured only as often as the mesh probes it) would
#: otherwise keep it idle while its neighbours queue (a 4-server run left one server at 326 ms
#: nearly idle).
RTT_WEIGHT_MS = 100.0
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
    failed_at: float = -math.inf
    stats: dict[str, float | None] = field(default_factory=dict)  # its figures (STAT_KEYS), for status


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


@dataclass
class Directory:
    own_id: str
    servers: dict[str, ServerInfo] = field(default_factory=dict)

    def update(self, peer: str, models: dict[str, str], capacity: int, load: int,
               stats: dict[str, float | None] | None = None) -> None:
        old = self.servers.get(peer)
        self.servers[peer] = ServerInfo(models, capacity, load, trio.current_time(), sent=old.sent if old else 0,
                                        failed_at=old.failed_at if old else -math.inf, stats=stats or {})

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
        """Each fresh server as status shows it: its models, load and announced figures."""
        return [{"peer": peer, "self": peer == self.own_id, "models": sorted(info.models), "load": info.load,
                 "capacity": info.capacity, "rtt_ms": None if peer == self.own_id else rtt_ms.get(peer),
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
            scored.append((max(info.load, info.sent) / info.capacity + min(1.0, rtt / RTT_WEIGHT_MS), peer))
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
