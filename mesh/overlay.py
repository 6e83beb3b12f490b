"""The overlay: the bounded set of neighbours each node gossips to and watches.

Every node knows the whole membership (the peer table), but talks to and probes only
``DEGREE`` of it, so what a node costs its machine does not grow with the mesh. The members
(this node included) are sorted on a ring of SHA-256(peer id); a node's neighbours are the
members at ring distances ±1, ±2 and at three longer strides, ±N^(1/4),
±N^(1/2) and ±N^(3/4) for N members, so gossip crosses the ring in a few hops (at most 7 at
N = 1,000, 12 at N = 5,000) instead of walking it.

Every link is mutual: distances along the same ring are symmetric, so ``q`` is a neighbour
of ``p`` exactly when ``p`` is one of ``q``. Each node therefore receives a gossiped message
from at most ``DEGREE`` peers, and is watched by the ``DEGREE`` peers it watches, whom a
killed node's silence reaches first.

A pure function of the membership, no I/O and no randomness: every node computes the same
overlay from the same view, and the choice is reproducible in tests and in the simulator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import lru_cache

#: Neighbours per node: gossip copies a node receives per message, and peers it probes.
DEGREE = 10


@lru_cache(maxsize=1 << 14)
def ring_key(peer: str) -> bytes:
    return hashlib.sha256(peer.encode()).digest()


@lru_cache(maxsize=1 << 14)
def ring_int(peer: str) -> int:
    """``ring_key`` as an integer: XOR distances on the ring (``MeshNode.dht_nearest``)."""
    return int.from_bytes(ring_key(peer), "big")


def strides(n: int) -> list[int]:
    """The ring distances a node links to, in a ring of ``n`` members."""
    out = [1, 2, round(n ** 0.25), round(n ** 0.5), round(n ** 0.75)]
    return sorted({d for d in out if d > 0})


def neighbours(self_id: str, members: Iterable[str], degree: int = DEGREE) -> list[str]:
    """The overlay neighbours of ``self_id`` among ``members`` (itself excluded): the nearest
    on the ring first; all of them while there are at most ``degree``."""
    ring = sorted({m for m in members} | {self_id}, key=ring_key)
    n = len(ring)
    if n - 1 <= degree:
        return sorted((m for m in ring if m != self_id), key=lambda m: _distance(ring, self_id, m))
    at = ring.index(self_id)
    out: list[str] = []
    for d in strides(n):
        for idx in (at + d, at - d):
            peer = ring[idx % n]
            if peer != self_id and peer not in out:
                out.append(peer)
    return out[:degree]


def _distance(ring: list[str], a: str, b: str) -> int:
    d = abs(ring.index(a) - ring.index(b))
    return min(d, len(ring) - d)
