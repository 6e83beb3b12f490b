"""Dialling one chosen address of one peer with py-libp2p 0.8.1.

``host.connect`` does not dial the address it is given; it adds it to the peerstore and calls
``swarm.dial_peer``, and two behaviours there defeat a node that rejoins a mesh that has moved:

1. **The negative cache.** Once a dial of a peer fails on every address, ``dial_peer`` refuses
   that peer for 60 s ("recently failed all addresses (negative cache)"), whatever address it is
   given next. A node restarted with a stale bootstrap address was blocked by this for longer
   than its whole bootstrap timeout. Our own backoff (``mesh.bootstrap``) decides when a peer is
   tried again, so the dialler lifts the block (``swarm.unblock_peer``) before each dial.
2. **One stored address per transport, the oldest.** ``dial_peer`` reads the peer's addresses
   from the peerstore, drops loopback ones when others exist, and dials at most one TCP address:
   the first stored. The peerstore appends, so a peer that moved to a new port is dialled at
   its old one. The dialler stores exactly the address it means to dial for the time of the
   dial, then puts the others back behind it, and drops the address if the dial failed (and
   lifts the block again: one address failed, not the peer).

The Noise handshake still checks that whoever answers holds the peer id's key: an address
from the book or from a peer is only a hint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mesh.addressbook import AddressBook, clean_addr
from mesh.bootstrap import Candidate
from mesh.host import HostError, parse_multiaddr
from mesh.names import addr_text, libp2p_id

# How long py-libp2p keeps the addresses we dial (its own connect() uses 120 s).
ADDR_TTL_S = 3600


class Libp2pDialer:
    """``await dialer(peer_id, addr)``: a connection to ``peer_id`` at ``addr``, or an error."""

    def __init__(self, host: Any) -> None:
        self.host = host

    async def __call__(self, peer_id: str, addr: str) -> None:
        from libp2p.peer.id import ID
        from libp2p.peer.peerinfo import PeerInfo

        pid = ID.from_base58(peer_id)
        if pid in self.host.get_network().connections:
            return
        target = parse_multiaddr(addr, "peer address")
        store = self.host.get_peerstore()
        others = [a for a in _stored(store, pid) if a != target]
        self.host.get_network().unblock_peer(pid)
        store.clear_addrs(pid)
        store.add_addrs(pid, [target], ADDR_TTL_S)
        ok = False
        try:
            await self.host.connect(PeerInfo(pid, [target]))
            ok = True
        finally:
            keep = [a for a in _stored(store, pid) if a != target and a not in others]
            store.clear_addrs(pid)
            store.add_addrs(pid, [target, *others, *keep] if ok else [*others, *keep], ADDR_TTL_S)
            if not ok:  # one address failed, not the peer: its other addresses stay dialable
                self.host.get_network().unblock_peer(pid)


def _stored(store: Any, pid: Any) -> list[Any]:
    try:
        return list(store.addrs(pid))
    except Exception:  # PeerStoreError: unknown or expired peer
        return []


def redial_addrs(host: Any, peer_id: str, book: AddressBook, limit: int = 4) -> list[str]:
    """Where to dial a known peer that has no connection, best guess first: the addresses
    py-libp2p learned last (identify and DHT answers append, so the newest is the last
    stored and likeliest current after a move), then the address book's, in its order (the
    one that worked first, failed ones last)."""
    stored = [addr_text(a) for a in reversed(_stored(host.get_peerstore(), libp2p_id(peer_id)))]
    entry = book.get(peer_id)
    out: list[str] = []
    for addr in [*stored, *(entry.addrs if entry else [])]:
        clean = direct(clean_addr(peer_id, addr))
        if clean is not None and clean not in out:
            out.append(clean)
    return out[:limit]


def direct(addr: str | None) -> str | None:
    """``addr`` if this dialler can use it: py-libp2p's swarm cannot dial a relay circuit
    (``mesh.relay`` does, from the peer's NodeInfo), so circuit addresses are left to it."""
    return None if addr is None or "/p2p-circuit" in addr else addr


def bootstrap_candidates(texts: Sequence[str], self_id: str) -> list[Candidate]:
    """``--bootstrap`` multiaddrs as candidates; raises ``HostError`` naming a bad one."""
    from libp2p.peer.peerinfo import info_from_p2p_addr

    out: dict[str, list[str]] = {}
    for text in texts:
        ma = parse_multiaddr(text, "bootstrap address")
        try:
            info = info_from_p2p_addr(ma)
        except Exception as exc:
            raise HostError(f"bootstrap address {text!r} needs a /p2p/<peer id> part ({exc})") from None
        peer = str(info.peer_id)
        if peer == self_id:
            continue
        addrs = out.setdefault(peer, [])
        addrs.extend(str(a) for a in info.addrs if str(a) not in addrs)
    return [Candidate(peer, tuple(addrs), "bootstrap") for peer, addrs in out.items() if addrs]


def join_candidates(bootstrap: Sequence[Candidate], book: AddressBook, exclude: set[str],
                    limit: int) -> list[Candidate]:
    """What to dial, best first: the ``--bootstrap`` peers (with any newer addresses the book
    has for them), then the book's best entries; peers in ``exclude`` (connected) left out."""
    out: list[Candidate] = []
    for cand in bootstrap:
        if cand.peer_id in exclude:
            continue
        entry = book.get(cand.peer_id)
        known = [a for a in (entry.addrs if entry else []) if a not in cand.addrs and direct(a)]
        out.append(Candidate(cand.peer_id, (*cand.addrs, *known), "bootstrap"))
    taken = {c.peer_id for c in out} | exclude
    for entry in book.best(4 * limit, exclude=taken):
        addrs = tuple(a for a in entry.addrs if direct(a))
        if addrs:  # a peer known only through relays is reached by mesh.relay once in the mesh
            out.append(Candidate(entry.peer_id, addrs, "book"))
    return out[:limit]
