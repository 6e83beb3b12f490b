"""The overlay: the bounded set of neighbours each node gossips to and watches.

Every node knows the whole membership (the peer table), but talks to and probes only about
``DEGREE`` of it, so what a node costs its machine does not grow with the mesh:

* ``RING`` neighbours on a ring of SHA-256(peer id), half on each side. Every node computes
  the same ring from the same membership, so ring links are mutual: each node is watched by
  the nodes it watches, and a killed node has ``RING`` watchers that notice.
* the rest are long links, picked by rendezvous hashing on (this node, peer): stable while
  the membership is, different for every node, so gossip crosses the ring in O(log n) hops
  (a small world) instead of walking it.

Pure functions of the membership, no I/O and no randomness: every node's choice is
reproducible, in tests and in the simulator.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable

#: Neighbours per node: gossip copies a node receives per message, and peers it probes.
DEGREE = 10
#: Of those, ring neighbours (half on each side).
RING = 6


def ring_key(peer: str) -> bytes:
    return hashlib.sha256(peer.encode()).digest()


def neighbours(self_id: str, members: Iterable[str], degree: int = DEGREE, ring: int = RING) -> list[str]:
    """The overlay neighbours of ``self_id`` among ``members`` (itself excluded): ring
    neighbours first, then long links; all of them while there are at most ``degree``."""
    others = sorted({m for m in members if m != self_id}, key=ring_key)
    if len(others) <= degree:
        return others
    keys = [ring_key(m) for m in others]
    at = bisect_left(keys, ring_key(self_id))
    side = ring // 2
    picked: list[str] = []
    for step in range(side):
        for idx in (at + step, at - 1 - step):
            peer = others[idx % len(others)]
            if peer not in picked:
                picked.append(peer)
    taken = set(picked)
    long_links = sorted((m for m in others if m not in taken),
                        key=lambda m: hashlib.sha256(f"{self_id}|{m}".encode()).digest())
    return picked + long_links[: degree - len(picked)]
