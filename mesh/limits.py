"""What one peer may cost this node: every bound of the inbound side, in one place.

Anyone who can reach a node can open streams, announce sizes, send bytes slowly or not at
all, flood gossip and ask for blobs, and each of those costs memory, file descriptors, worker
threads or CPU here. ``PeerLimits`` names each bound (docs/security.md lists them with their
defaults). ``Quota`` counts what is in use per peer and in total, ``RateLimiter`` meters
gossip per origin and per forwarding peer, and ``LogThrottle`` keeps a flood from becoming a
flood of log lines too.

Nothing here waits: over a limit the caller refuses at once, so no peer can make another
queue behind it, and a refusal is cheap enough to make thousands of times a second.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import trio

from mesh.errors import MeshError

MiB = 1 << 20


@dataclass(frozen=True)
class PeerLimits:
    """The inbound bounds of one node. The defaults leave honest traffic (a member's update,
    a leader's partial, a burst of gossip after a round) far below every limit."""

    #: A stream that delivers no byte for this long is dropped: bytes must keep arriving.
    read_timeout_s: float = 10.0
    #: Message streams (requests: updates, partials, plans, sync pages) open at once, from one
    #: peer and from all peers ...
    streams_per_peer: int = 16
    streams_total: int = 256
    #: ... and gossip streams (gossip and presence), apart: at a thousand simulated members
    #: every member's presence reached a round's root as the round began, and with one budget
    #: for both the root refused its children's partials (282 streams refused) and waited for
    #: them until its deadline.
    gossip_streams_per_peer: int = 16
    gossip_streams_total: int = 256
    #: Bytes of signed frames being received at once (each frame grows as its bytes arrive).
    frame_bytes_per_peer: int = 32 * MiB
    frame_bytes_total: int = 128 * MiB
    #: Requests carrying a payload (an update, a partial) received at once.
    payloads_per_peer: int = 2
    payloads_total: int = 32
    #: Blob requests served at once.
    blob_serves_per_peer: int = 4
    blob_serves_total: int = 32
    #: One-off bulk side-channel listeners (a blob served, a payload pushed) open at once;
    #: the transfers run on their own pool of this many worker threads, apart from the
    #: node's own work.
    bulk_per_peer: int = 2
    bulk_total: int = 8
    #: Relay (circuit v2 hop) streams open at once, from one peer and from all peers, on a
    #: node that offers the relay service; a stream that carries a circuit holds its slot
    #: for the circuit's life (the relay's own limits bound those: see ``RelayLimitsConfig``).
    relay_streams_per_peer: int = 8
    relay_streams_total: int = 256
    #: New gossip messages accepted per second, with bursts, per origin (the signer)...
    gossip_origin_rate: float = 10.0
    gossip_origin_burst: float = 100.0
    #: ... and gossip streams per second from one forwarding peer (duplicates included).
    gossip_peer_rate: float = 100.0
    gossip_peer_burst: float = 400.0
    #: Origins and peers the rate limiters remember; the least recently seen are forgotten.
    tracked_keys: int = 4096

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"limit {name} must be positive, got {value!r}")


class Busy(MeshError):
    """A peer (or all peers together) is at a limit: the stream or request is refused now.
    It is not a fault, so it costs no penalty; an honest peer's retry finds room."""


class Quota:
    """Units in use (streams, bytes, listeners) per peer and in total."""

    def __init__(self, per_peer: int, total: int, what: str) -> None:
        self.per_peer, self.total, self.what = per_peer, total, what
        self.used = 0
        self._by_peer: dict[str, int] = {}

    def take(self, peer: str, n: int = 1) -> None:
        """Claim ``n`` units for ``peer``, or raise ``Busy``."""
        mine = self._by_peer.get(peer, 0)
        if mine + n > self.per_peer:
            raise Busy(f"{self.what}: peer {peer[-8:]} is at its limit of {self.per_peer}")
        if self.used + n > self.total:
            raise Busy(f"{self.what}: this node is at its limit of {self.total} for all peers")
        self._by_peer[peer] = mine + n
        self.used += n

    def give(self, peer: str, n: int = 1) -> None:
        left = self._by_peer.get(peer, 0) - n
        if left > 0:
            self._by_peer[peer] = left
        else:
            self._by_peer.pop(peer, None)
        self.used = max(0, self.used - n)

    def of(self, peer: str) -> int:
        return self._by_peer.get(peer, 0)


class Charge:
    """Bytes one stream holds against a ``Quota`` of bytes, given back on ``release``."""

    def __init__(self, quota: Quota, peer: str) -> None:
        self.quota, self.peer, self.held = quota, peer, 0

    def __call__(self, n: int) -> None:
        self.quota.take(self.peer, n)
        self.held += n

    def release(self) -> None:
        self.quota.give(self.peer, self.held)
        self.held = 0


class RateLimiter:
    """A token bucket per key: ``rate`` tokens a second, at most ``burst`` saved up. Only the
    ``keys`` most recently seen are remembered, so many keys (cheap to make) cost bounded
    memory; a forgotten key starts again with a full bucket, which a flood from fresh keys
    meets at the forwarding peer's own bucket instead."""

    def __init__(self, rate: float, burst: float, keys: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.keys, self.clock = rate, burst, keys, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, key: str) -> bool:
        now = self.clock()
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > self.keys:
            self._buckets.popitem(last=False)
        return allowed


class LogThrottle:
    """At most one log line per key per ``every_s``, saying how many were held back."""

    def __init__(self, log: logging.Logger, every_s: float = 30.0, keys: int = 1024) -> None:
        self.log, self.every_s, self.keys = log, every_s, keys
        self._last: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def warning(self, key: str, message: str) -> None:
        now = time.monotonic()
        at, held = self._last.pop(key, (-1e18, 0))
        if now - at < self.every_s:
            self._last[key] = (at, held + 1)
            return
        self._last[key] = (now, 0)
        while len(self._last) > self.keys:
            self._last.popitem(last=False)
        self.log.warning("%s%s", message, f" ({held} more like it not logged)" if held else "")


class PeerQuotas:
    """The live counters of one node's ``PeerLimits``, shared by its inbound handlers."""

    def __init__(self, limits: PeerLimits) -> None:
        self.limits = limits
        self.streams = Quota(limits.streams_per_peer, limits.streams_total, "inbound streams")
        self.gossip_streams = Quota(limits.gossip_streams_per_peer, limits.gossip_streams_total, "gossip streams")
        self.frame_bytes = Quota(limits.frame_bytes_per_peer, limits.frame_bytes_total, "frame bytes")
        self.payloads = Quota(limits.payloads_per_peer, limits.payloads_total, "inbound payloads")
        self.relay_streams = Quota(limits.relay_streams_per_peer, limits.relay_streams_total, "relay streams")
        self.blob_serves = Quota(limits.blob_serves_per_peer, limits.blob_serves_total, "blob requests")
        self.bulk = BulkGate(Quota(limits.bulk_per_peer, limits.bulk_total, "bulk listeners"),
                             trio.CapacityLimiter(limits.bulk_total))
        keys = limits.tracked_keys
        self.gossip_origins = RateLimiter(limits.gossip_origin_rate, limits.gossip_origin_burst, keys)
        self.gossip_peers = RateLimiter(limits.gossip_peer_rate, limits.gossip_peer_burst, keys)


@dataclass(frozen=True)
class BulkGate:
    """Who may get a one-off bulk listener now, and the worker threads its transfer runs on:
    a pool of its own, so peers' transfers never hold the threads the node's own work
    (training, exports) runs on."""

    quota: Quota
    threads: trio.CapacityLimiter

    def open(self, peer: str) -> bool:
        """Claim a listener for ``peer``; False when none is free (the bytes then take the
        libp2p stream, which costs no thread and no port)."""
        try:
            self.quota.take(peer)
        except Busy:
            return False
        return True

    def close(self, peer: str) -> None:
        self.quota.give(peer)
