"""The address book: the peers this node has met, kept across restarts.

A node that only knows its ``--bootstrap`` list cannot rejoin a mesh that has moved on: home
addresses change with the ISP lease, the friend it bootstrapped from turns their PC off, a laptop
wakes up on another network. Like Bitcoin's ``peers.dat`` or the IPFS peerstore, the book keeps
every peer the node has learned, with its addresses, when it was last heard from and whether
this node reached it by dialling, so a restarted node has many doors back in.

Trust: an address in the book is a hint to try, nothing more. Most of them were announced by the
peers themselves (identify, signed NodeInfo) or relayed by the DHT, so every string and count is
bounded here, and the Noise handshake proves who answers a dial. A peer that floods hints can
only displace other hints: peers this node has heard from or dialled rank above every hint,
failed dials or not (a peer that restarted fails a few dials and must not lose its place).

The book is bounded (``max_peers`` entries, ``MAX_ADDRS`` addresses each) and, when full, drops
the worst entry first: the least reliable (never verified, many failed dials in a row), then the
one heard from longest ago. It is written atomically (``mesh.fsutil``), and a corrupt file is put
aside with a clear log line rather than stopping the node.

Pure bookkeeping: no I/O but ``load``/``save``, no trio, no libp2p, a clock passed in for tests.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesh.errors import MeshError
from mesh.fsutil import atomic_write

log = logging.getLogger("mesh.addressbook")

BOOK_FILE = "peers.json"
BOOK_VERSION = 1
MAX_PEERS = 256
MAX_ADDRS = 4
MAX_ADDR_LEN = 256
MAX_FILE_BYTES = 1 << 20
MAX_FAILURES = 1000
# How far last_seen must move before the entry is worth rewriting the file for.
SEEN_RESOLUTION_S = 60.0
# base58btc, as libp2p peer ids are written ("12D3KooW…" for Ed25519, "Qm…" for RSA).
_PEER_ID = re.compile(r"[1-9A-HJ-NP-Za-km-z]{20,128}")
# A transport address: network part, then a port, then plain path components (/quic-v1, /ws,
# /p2p/<relay>/p2p-circuit). Nothing here is ever a path or code, but it is logged and dialled.
_ADDR = re.compile(
    r"/(ip4|ip6|dns|dns4|dns6)/[A-Za-z0-9.:\-]{1,253}/(tcp|udp)/[0-9]{1,5}(/[A-Za-z0-9.\-]{1,128}){0,8}")
_UNSPECIFIED = ("/ip4/0.0.0.0/", "/ip6/::/")


class AddressBookError(MeshError, ValueError):
    """An entry or a file that the book refuses; the message says which part and why."""


def valid_peer_id(text: object) -> bool:
    return isinstance(text, str) and _PEER_ID.fullmatch(text) is not None


def clean_addr(peer_id: str, text: object) -> str | None:
    """``text`` as a dialable transport address of ``peer_id`` (no ``/p2p/`` suffix), or None.

    A trailing ``/p2p/<id>`` is dropped when it names ``peer_id`` and refused when it names
    another peer; unspecified hosts (0.0.0.0) and port 0 cannot be dialled and are refused."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_ADDR_LEN:
        return None
    suffix = f"/p2p/{peer_id}"
    if text.endswith(suffix):
        text = text[: -len(suffix)]
    if _ADDR.fullmatch(text) is None or text.startswith(_UNSPECIFIED):
        return None
    parts = text.split("/")
    if int(parts[4]) == 0 or not 0 < int(parts[4]) < 65536:
        return None
    if "p2p" in parts[5:] and not text.endswith("/p2p-circuit"):
        return None  # an address of some other peer
    return text


@dataclass
class BookEntry:
    """What this node knows of one peer. Times are wall-clock seconds, 0 meaning never."""

    peer_id: str
    addrs: list[str] = field(default_factory=list)  # best first: the last one that worked leads
    last_seen: float = 0.0  # heard from over an authenticated connection (either direction)
    last_reached: float = 0.0  # this node dialled it and the handshake proved its identity
    last_failed: float = 0.0
    failures: int = 0  # failed dials in a row since the last success

    @property
    def verified(self) -> bool:
        return self.last_seen > 0 or self.last_reached > 0

    def rank(self) -> tuple[int, int, float]:
        """Sort key, best first. A peer this node verified itself (heard from, or dialled)
        comes before every hint, however many dials to it failed since: a restarted node tries
        its own peers first, and hints passed on by others never push them out of a full book.
        Within each, being dialled successfully counts for a peer (it is reachable), being
        heard from counts less (it may sit behind a NAT), and each failed dial in a row counts
        against it; ties go to the one heard from last."""
        tier = 0 if self.last_reached else 1 if self.last_seen else 2
        return (0 if self.verified else 1, tier + min(self.failures, 8), -max(self.last_seen, self.last_reached))

    def row(self) -> dict[str, Any]:
        # Field by field, not ``dataclasses.asdict`` (a deep copy, ten times the cost): every
        # node writes its book every few seconds while its peers change.
        return {"peer_id": self.peer_id, "addrs": list(self.addrs), "last_seen": self.last_seen,
                "last_reached": self.last_reached, "last_failed": self.last_failed, "failures": self.failures}


class AddressBook:
    """Bounded, persisted set of :class:`BookEntry`; ``path=None`` keeps it in memory only."""

    def __init__(self, path: Path | None, self_id: str, *, max_peers: int = MAX_PEERS,
                 clock: Callable[[], float] = time.time) -> None:
        if max_peers < 1:
            raise ValueError("max_peers must be at least 1")
        self.path = path
        self.self_id = self_id
        self.max_peers = max_peers
        self.clock = clock
        self._entries: dict[str, BookEntry] = {}
        self.joined = 0.0  # when this node first met a peer: it has been in a mesh since
        self.listen: list[str] = []  # where this node itself listened last (mesh.host.sticky_listen)
        self.dirty = False

    # -- queries -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._entries

    def get(self, peer_id: str) -> BookEntry | None:
        return self._entries.get(peer_id)

    def best(self, limit: int | None = None, exclude: Iterable[str] = ()) -> list[BookEntry]:
        """Entries with at least one address, best first."""
        skip = set(exclude)
        ranked = sorted((e for e in self._entries.values() if e.addrs and e.peer_id not in skip),
                        key=BookEntry.rank)
        return ranked if limit is None else ranked[:limit]

    # -- learning ------------------------------------------------------------------------------

    def seen(self, peer_id: str, addrs: Iterable[object] = ()) -> BookEntry | None:
        """``peer_id`` answered over an authenticated connection. ``addrs`` are its own current
        claims (its signed NodeInfo): they lead, so a peer that moved is dialled where it is now."""
        now = self.clock()
        if not self.joined and valid_peer_id(peer_id) and peer_id != self.self_id:
            self.joined = now  # in a mesh now, whether or not this peer's addresses are known yet
            self.dirty = True
        entry = self._learn(peer_id, addrs, lead=True)
        if entry is None:
            return None
        if now - entry.last_seen >= SEEN_RESOLUTION_S:
            self.dirty = True
        entry.last_seen = now
        return self._evict(peer_id)

    def hint(self, peer_id: str, addrs: Iterable[object]) -> BookEntry | None:
        """Addresses for ``peer_id`` that someone else passed on: kept, but ranked last."""
        return self._evict(peer_id) if self._learn(peer_id, addrs) else None

    def reached(self, peer_id: str, addr: str) -> None:
        """This node dialled ``addr`` and the handshake proved it is ``peer_id``."""
        entry = self._learn(peer_id, [addr])
        if entry is None:
            return
        now = self.clock()
        clean = clean_addr(peer_id, addr)
        if clean is not None:
            entry.addrs = [clean, *(a for a in entry.addrs if a != clean)][:MAX_ADDRS]
        entry.last_reached = entry.last_seen = now
        entry.failures = 0
        self.joined = self.joined or now
        self.dirty = True
        self._evict(peer_id)

    def failed(self, peer_id: str, addr: str) -> None:
        """A dial of ``addr`` failed: count it, and try that address last next time."""
        entry = self._entries.get(peer_id)
        if entry is None:
            return
        clean = clean_addr(peer_id, addr)
        if clean in entry.addrs:
            entry.addrs = [*(a for a in entry.addrs if a != clean), clean]
        entry.failures = min(entry.failures + 1, MAX_FAILURES)
        entry.last_failed = self.clock()
        self.dirty = True

    def listening(self, addrs: Iterable[object]) -> None:
        """Remember this node's own listen addresses, to ask for the same ports next time."""
        mine = [a for a in addrs if isinstance(a, str) and len(a) <= MAX_ADDR_LEN and _ADDR.fullmatch(a)][:MAX_ADDRS]
        if mine != self.listen:
            self.listen = mine
            self.dirty = True

    def _learn(self, peer_id: str, addrs: Iterable[object], lead: bool = False) -> BookEntry | None:
        if not valid_peer_id(peer_id) or peer_id == self.self_id:
            return None
        fresh: list[str] = []
        for i, raw in enumerate(addrs):
            if i >= 4 * MAX_ADDRS:
                break  # a peer announcing hundreds of addresses gets its first few looked at
            clean = clean_addr(peer_id, raw)
            if clean is not None and clean not in fresh:
                fresh.append(clean)
        entry = self._entries.get(peer_id)
        if entry is None:
            if not fresh:
                return None  # nothing to dial: not worth a slot
            entry = BookEntry(peer_id)
            self._entries[peer_id] = entry
            self.dirty = True
        # A peer's own claims lead; a hint keeps the known addresses in their place (the one that
        # worked first) and goes after them. The list keeps its first MAX_ADDRS.
        if lead:
            merged = fresh + [a for a in entry.addrs if a not in fresh]
        else:
            merged = entry.addrs + [a for a in fresh if a not in entry.addrs]
        if merged[:MAX_ADDRS] != entry.addrs:
            entry.addrs = merged[:MAX_ADDRS]
            self.dirty = True
        return entry

    def _evict(self, peer_id: str | None = None) -> BookEntry | None:
        """Drop the worst entries down to ``max_peers``; returns ``peer_id``'s entry if kept."""
        while len(self._entries) > self.max_peers:
            worst = max(self._entries.values(), key=BookEntry.rank)
            del self._entries[worst.peer_id]
            self.dirty = True
        return None if peer_id is None else self._entries.get(peer_id)

    # -- persistence ---------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        # One entry a line, each by json's C encoder (an ``indent`` makes json use its pure
        # Python one, several times slower): still readable, diffable and plain JSON.
        head = json.dumps({"joined": self.joined, "listen": self.listen, "version": BOOK_VERSION}, sort_keys=True)
        rows = ",\n  ".join(json.dumps(e.row(), sort_keys=True)
                            for e in sorted(self._entries.values(), key=BookEntry.rank))
        peers = f"[\n  {rows}\n]" if rows else "[]"
        return f'{head[:-1]}, "peers": {peers}}}\n'.encode()

    def save(self) -> None:
        """Write the book atomically (mode 0600); raises ``StateWriteError`` on a full disk."""
        if self.path is None:
            self.dirty = False
            return
        atomic_write(self.path, self.to_bytes())
        self.dirty = False

    def load(self) -> int:
        """Read the book from ``path``; returns how many entries were kept.

        A missing file is an empty book. A file that is not a book (torn by hand, another
        program's, too large) is renamed to ``<name>.corrupt`` and the node starts with an empty
        book; an entry that is not valid is skipped and counted in one log line."""
        if self.path is None or not self.path.exists():
            return 0
        try:
            if not self.path.is_file():
                raise AddressBookError("not a regular file")
            with self.path.open("rb") as f:  # bounded read: the size may change after a stat
                raw = f.read(MAX_FILE_BYTES + 1)
            if len(raw) > MAX_FILE_BYTES:
                raise AddressBookError(f"larger than {MAX_FILE_BYTES} bytes")
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != BOOK_VERSION:
                raise AddressBookError(f"not a version {BOOK_VERSION} address book")
            peers = doc.get("peers")
            if not isinstance(peers, list):
                raise AddressBookError("no peer list")
        except (OSError, ValueError, RecursionError) as exc:  # deep nesting: RecursionError
            aside = self.path.with_name(self.path.name + ".corrupt")
            try:
                self.path.replace(aside)
                kept = f"the bad file is kept as {aside.name}"
            except OSError:
                kept = "the bad file could not be moved aside"
            log.warning("address book %s is unreadable (%s); starting with an empty book, %s",
                        self.path, exc, kept)
            return 0
        self.joined = _time(doc.get("joined"), self.clock())
        listen = doc.get("listen")
        self.listen = [] if not isinstance(listen, list) else [
            a for a in listen[:MAX_ADDRS] if isinstance(a, str) and len(a) <= MAX_ADDR_LEN and _ADDR.fullmatch(a)]
        skipped = 0
        for raw in peers[: 4 * self.max_peers]:
            entry = _entry(raw, self.self_id, self.clock())
            if entry is None or entry.peer_id in self._entries:
                skipped += 1
                continue
            self._entries[entry.peer_id] = entry
        skipped += max(0, len(peers) - 4 * self.max_peers)
        self._evict()
        if skipped:
            log.warning("address book %s: skipped %d invalid entries", self.path, skipped)
        if self._entries and not self.joined:
            self.joined = min(max(e.last_seen, e.last_reached) for e in self._entries.values()) or 1.0
        self.dirty = bool(skipped)
        return len(self._entries)


def _time(value: object, now: float) -> float:
    """A stored timestamp, clamped to [0, now]: a file from the future must not outrank today."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return float(min(max(value, 0.0), now))


def _entry(raw: object, self_id: str, now: float) -> BookEntry | None:
    if not isinstance(raw, dict):
        return None
    peer_id = raw.get("peer_id")
    if not valid_peer_id(peer_id) or peer_id == self_id:
        return None
    assert isinstance(peer_id, str)
    addrs_in = raw.get("addrs")
    if not isinstance(addrs_in, list):
        return None
    addrs: list[str] = []
    for a in addrs_in[: 4 * MAX_ADDRS]:
        clean = clean_addr(peer_id, a)
        if clean is not None and clean not in addrs:
            addrs.append(clean)
    addrs = addrs[:MAX_ADDRS]
    if not addrs:
        return None
    failures = raw.get("failures", 0)
    if isinstance(failures, bool) or not isinstance(failures, int):
        failures = 0
    return BookEntry(peer_id=peer_id, addrs=addrs, last_seen=_time(raw.get("last_seen"), now),
                     last_reached=_time(raw.get("last_reached"), now),
                     last_failed=_time(raw.get("last_failed"), now),
                     failures=min(max(failures, 0), MAX_FAILURES))
