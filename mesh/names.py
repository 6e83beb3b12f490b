"""libp2p's names for peers and addresses, parsed once.

A node turns the same peer ids and addresses back and forth all the time: every second it
reads its routing table and connections as libp2p ``ID`` objects (base58 each time), and
every NodeInfo it learns names addresses to parse into ``Multiaddr`` objects for the
peerstore. Both conversions are pure and their results immutable, so they are cached here,
bounded (least recently used out). In the simulator (``mesh.testing.simnet``), where one
process holds a thousand nodes, the caches are shared by all of them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

#: Names remembered per cache: a peer table's worth.
CACHED_NAMES = 1 << 13


@lru_cache(maxsize=CACHED_NAMES)
def peer_text(pid: Any) -> str:
    """A libp2p ``ID`` as its base58 text."""
    return str(pid)


@lru_cache(maxsize=CACHED_NAMES)
def libp2p_id(peer: str) -> Any:
    """The libp2p ``ID`` of a base58 peer id (raises for one that is not)."""
    from libp2p.peer.id import ID

    return ID.from_base58(peer)


@lru_cache(maxsize=CACHED_NAMES)
def multiaddr_of(text: str) -> Any:
    """A ``Multiaddr`` parsed from ``text`` (raises for one that is not: failures are not cached)."""
    from multiaddr import Multiaddr

    return Multiaddr(text)


@lru_cache(maxsize=CACHED_NAMES)
def addr_text(addr: Any) -> str:
    """A ``Multiaddr`` as text (py-multiaddr decodes its bytes again at every ``str``)."""
    return str(addr)
