"""A direct TCP side channel for bulk bytes, keyed through the authenticated libp2p stream.

py-libp2p moves every byte through Python-level Noise (64 KiB messages) and yamux framing,
which caps a blob transfer near a tenth of what the same TCP socket can carry. Blobs and
update payloads are almost all of a round's traffic, so they get their own path, while
everything that needs trust stays on the libp2p stream:

* the request, the size (and a blob's hash), and a fresh random 32-byte key travel inside the
  Noise session, so only the authenticated peer learns the key;
* the bytes then travel over a plain TCP connection in sealed frames (AES-256-GCM where the
  CPU has AES instructions, ChaCha20-Poly1305 elsewhere, both from OpenSSL, which releases
  the GIL and runs several GB/s). Each frame's nonce is a counter plus a tag (hello or data) and
  the associated data is the transfer id, so reordered, replayed, injected or cut frames fail
  authentication;
* the dialer proves it holds the key (a sealed hello) before a byte moves either way, so a
  stranger who reaches the port first learns nothing, delivers nothing, and is dropped.

Who listens depends on who could dial whom. A blob's server listens and the fetching peer
dials (``BulkSender`` / ``BulkReceiver``); a large message payload is pushed, so the
receiving node listens where the pusher already reached it over libp2p and the pusher dials
(``BulkInbox`` / ``BulkPusher``, driven by ``mesh.push``). Either listener exists for one
transfer only: bound to the node's own listen host on a fresh port, answering only the
peer's IP, closed after the transfer or after ``ACCEPT_TIMEOUT_S``. A connection from any
other address is closed at once without counting against the peer: strangers cannot close the
port on the real peer by failing ``MAX_STRANGERS`` hellos first. When the dialer cannot
connect (a NAT, a firewall) it says so on the libp2p stream and the bytes come over libp2p
as before. A blob's hash is still checked on arrival: the channel proves who sent the bytes,
the hash proves they are the right ones.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from mesh.codec import Truncated, WireError, WireReason
from mesh.errors import MeshError

FRAME = 1 << 20  # plaintext bytes per sealed frame
TAG = 16
ACCEPT_TIMEOUT_S = 15.0
IO_TIMEOUT_S = 15.0  # no progress this long ends the transfer (a cut link, a stalled peer)
MAX_STRANGERS = 8  # connections from the peer's IP that fail the hello before the listener gives up
#: Connections one listener accepts at most, strangers from other addresses included (each of
#: those is closed at once and costs nothing else, so they cannot use up the peer's tries).
MAX_ACCEPTS = 1024
HELLO = b"gpuflex-bulk-hello"
_LEN = struct.Struct(">I")
_DATA = b"\x00\x00\x00\x01"  # nonce tag of payload frames, which flow one way per transfer
_HELLO = b"\x00\x00\x00\x02"  # nonce tag of the dialer's proof of the key
CIPHERS = ("aes256gcm", "chacha20poly1305")


class BulkUnavailable(MeshError):
    """The side channel could not be set up; the caller falls back to the libp2p stream."""


@cache
def _cpu_has_aes() -> bool:
    """AES-GCM is the faster cipher only with hardware AES; without it ChaCha20 wins by far."""
    if platform.machine().lower() in {"arm64", "aarch64"}:
        return True
    try:
        with open("/proc/cpuinfo") as fh:
            return any(line.startswith("flags") and " aes" in line for line in fh)
    except OSError:
        return False


def preferred_ciphers() -> list[str]:
    return list(CIPHERS) if _cpu_has_aes() else list(reversed(CIPHERS))


def _aead(cipher: str, key: bytes) -> Any:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    return AESGCM(key) if cipher == "aes256gcm" else ChaCha20Poly1305(key)


def _nonce(counter: int, direction: bytes) -> bytes:
    return counter.to_bytes(8, "big") + direction


@dataclass(frozen=True)
class BulkOffer:
    """What the sender tells the receiver, inside Noise, to open the side channel."""

    port: int
    key: bytes
    tid: bytes
    cipher: str

    def to_wire(self) -> dict[str, Any]:
        return {"port": self.port, "key": self.key, "tid": self.tid, "cipher": self.cipher}

    @classmethod
    def from_wire(cls, obj: object) -> BulkOffer:
        if not isinstance(obj, dict):
            raise WireError(WireReason.GARBLED, "bulk offer is not a map")
        port, key, tid, cipher = obj.get("port"), obj.get("key"), obj.get("tid"), obj.get("cipher")
        if not (isinstance(port, int) and 0 < port < 65536 and isinstance(key, bytes) and len(key) == 32
                and isinstance(tid, bytes) and len(tid) == 16 and cipher in CIPHERS):
            raise WireError(WireReason.GARBLED, "bulk offer has a bad port, key, id or cipher")
        return cls(port, key, tid, str(cipher))


def choose_cipher(offered: object) -> str | None:
    """The receiver's most preferred cipher that this side also runs; None if nothing fits."""
    if not isinstance(offered, list):
        return None
    return next((c for c in offered if c in CIPHERS), None)


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise Truncated(f"bulk channel closed after {got} of {len(view)} bytes of a frame", got)
        got += n


def _read_frame(sock: socket.socket, buf: bytearray, limit: int) -> memoryview:
    head = memoryview(bytearray(_LEN.size))
    _recv_exactly(sock, head)
    (size,) = _LEN.unpack(head)
    if size < TAG or size > limit + TAG:
        raise WireError(WireReason.OVERSIZED, f"bulk frame of {size} bytes (limit {limit + TAG})")
    view = memoryview(buf)[:size]
    _recv_exactly(sock, view)
    return view


class _Listening:
    """The side that opens a one-off port: it answers only the peer's IP, and only a dialer
    that proves it holds the key (a sealed hello) gets a byte in either direction."""

    def __init__(self, host: str, peer_ip: str | None, cipher: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, 0), family=family, backlog=4)
        except OSError as exc:
            raise BulkUnavailable(f"cannot open a bulk listener on {host}: {exc.strerror or exc}") from None
        self._listener.settimeout(ACCEPT_TIMEOUT_S)
        self._peer_ip = peer_ip
        self._closed = threading.Event()
        self.offer = BulkOffer(self._listener.getsockname()[1], secrets.token_bytes(32),
                               secrets.token_bytes(16), cipher)
        self._conn: socket.socket | None = None

    def close(self) -> None:
        """Stop waiting (the peer fell back, or the transfer was cancelled)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> socket.socket:
        try:
            conn = self._accept_hello()
        finally:
            with contextlib.suppress(OSError):
                self._listener.close()
        self._conn = conn
        return conn

    def _accept_hello(self) -> socket.socket:
        aead = _aead(self.offer.cipher, self.offer.key)
        buf = bytearray(len(HELLO) + TAG)
        deadline = time.monotonic() + ACCEPT_TIMEOUT_S
        strangers = 0
        for _ in range(MAX_ACCEPTS):
            if strangers >= MAX_STRANGERS or time.monotonic() >= deadline:
                break
            self._listener.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, addr = self._listener.accept()
            except OSError:
                break
            if self._peer_ip is not None and addr[0] != self._peer_ip:
                conn.close()  # not the requesting peer's address: ignored, and no try used up
                continue
            conn.settimeout(min(5.0, IO_TIMEOUT_S))
            try:
                hello = _read_frame(conn, buf, len(HELLO))
                if aead.decrypt(_nonce(0, _HELLO), hello, self.offer.tid) != HELLO:
                    raise WireError(WireReason.AUTH, "bulk hello does not match")
            except Exception:  # whoever dialled and failed the hello, however, is not our peer
                conn.close()
                strangers += 1
                continue
            conn.settimeout(IO_TIMEOUT_S)
            return conn
        raise BulkUnavailable("the peer never opened the bulk channel")


class _Dialing:
    """The side that connects to the peer's one-off port and proves it holds the key."""

    def __init__(self, host: str, offer: BulkOffer) -> None:
        self.host = host
        self.offer = offer
        self._sock: socket.socket | None = None
        self._aborted = threading.Event()

    def connect(self, timeout: float = 5.0) -> None:
        try:
            self._sock = socket.create_connection((self.host, self.offer.port), timeout=timeout)
        except OSError as exc:
            raise BulkUnavailable(f"cannot reach the bulk channel at {self.host}:{self.offer.port}: "
                                  f"{exc.strerror or exc}") from None
        self._sock.settimeout(IO_TIMEOUT_S)
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        aead = _aead(self.offer.cipher, self.offer.key)
        sealed = aead.encrypt(_nonce(0, _HELLO), HELLO, self.offer.tid)
        self._sock.sendall(_LEN.pack(len(sealed)) + sealed)

    def abort(self) -> None:
        self._aborted.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def _connected(self) -> socket.socket:
        if self._sock is None:
            raise BulkUnavailable("bulk channel not connected")
        return self._sock


def _send_sealed(conn: socket.socket, offer: BulkOffer, source: memoryview, stop: threading.Event) -> int:
    """Blocking: ``source`` in sealed frames, each sealed straight into one reused buffer."""
    aead = _aead(offer.cipher, offer.key)
    frame = memoryview(bytearray(_LEN.size + FRAME + TAG))
    size = len(source)
    sent = 0
    counter = 0
    with conn:
        while sent < size and not stop.is_set():
            n = min(FRAME, size - sent)
            sealed = aead.encrypt_into(_nonce(counter, _DATA), source[sent : sent + n], offer.tid,
                                       frame[_LEN.size : _LEN.size + n + TAG])
            _LEN.pack_into(frame, 0, sealed)
            conn.sendall(frame[: _LEN.size + sealed])
            sent += n
            counter += 1
    return sent


def _receive_sealed(sock: socket.socket, offer: BulkOffer, size: int, sink: Callable[[memoryview], None],
                    stop: threading.Event) -> None:
    """Blocking: read ``size`` plaintext bytes, passing each frame to ``sink`` in order.

    Each frame is read into one buffer, decrypted in place and handed to ``sink`` (hash and
    file write, or a copy into memory) on the same thread while it is still in the CPU cache:
    on two cores, with the sender on the other, a separate hashing thread only added contention.
    """
    aead = _aead(offer.cipher, offer.key)
    buf = bytearray(FRAME + TAG)
    got = 0
    counter = 0
    try:
        with sock:
            while got < size and not stop.is_set():
                sealed = _read_frame(sock, buf, FRAME)
                try:
                    n = aead.decrypt_into(_nonce(counter, _DATA), sealed, offer.tid, sealed[: len(sealed) - TAG])
                except Exception:  # the AEAD libraries raise their own types for a bad tag
                    raise WireError(WireReason.AUTH, f"bulk frame {counter} failed authentication") from None
                if got + n > size:
                    raise WireError(WireReason.OVERSIZED, f"bulk channel sent more than the {size} bytes announced")
                sink(sealed[:n])
                got += n
                counter += 1
    except OSError as exc:
        if stop.is_set():
            raise BulkUnavailable("bulk transfer cancelled") from None
        raise Truncated(f"bulk channel failed after {got} of {size} bytes: {exc.strerror or exc}",
                        got) from None
    if got < size:
        raise BulkUnavailable("bulk transfer cancelled")


class BulkSender(_Listening):
    """A blob's serving side: it listens, the fetching peer dials in and is sent the bytes."""

    def serve(self, path: Path, size: int) -> int:
        """Blocking: send ``size`` bytes of ``path``; returns bytes sent."""
        conn = self._accept()
        try:
            with conn, open(path, "rb") as fh, _mapped(fh, size) as source:
                return _send_sealed(conn, self.offer, source, self._closed)
        finally:
            self._conn = None


class BulkReceiver(_Dialing):
    """A blob's fetching side: it dials the server's port and receives."""

    def receive(self, size: int, sink: Callable[[memoryview], None]) -> None:
        _receive_sealed(self._connected(), self.offer, size, sink, self._aborted)


class BulkInbox(_Listening):
    """A pushed payload's receiving side (a large message): it listens where the pusher
    already reached it over libp2p, so the TCP connection goes the way the peer could dial."""

    def receive(self, size: int, sink: Callable[[memoryview], None]) -> None:
        conn = self._accept()
        try:
            _receive_sealed(conn, self.offer, size, sink, self._closed)
        finally:
            self._conn = None


class BulkPusher(_Dialing):
    """A pushed payload's sending side: it dials the receiver's port and sends."""

    def send(self, source: memoryview) -> int:
        return _send_sealed(self._connected(), self.offer, source, self._aborted)


@contextlib.contextmanager
def _mapped(fh: Any, size: int) -> Iterator[memoryview]:
    """The file's pages, read in place: sealing straight from the page cache skips a copy."""
    if os.fstat(fh.fileno()).st_size < size:
        raise WireError(WireReason.TRUNCATED, "blob file is shorter than its announced size")
    mapping = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ) if size else None
    view = memoryview(mapping) if mapping is not None else memoryview(b"")
    try:
        yield view
    finally:
        view.release()
        if mapping is not None:
            mapping.close()


def bind_host(listen: list[str]) -> str | None:
    """The IP the user asked this node to listen on (from its first TCP multiaddr)."""
    for addr in listen:
        parts = addr.split("/")
        if len(parts) >= 5 and parts[1] in {"ip4", "ip6"} and parts[3] == "tcp":
            return parts[2]
    return None


def peer_ip(stream: Any) -> str | None:
    try:
        remote = stream.get_remote_address()
    except Exception:  # py-libp2p transports differ in what they support
        return None
    return str(remote[0]) if remote else None


def env_disabled() -> bool:
    """``GPUFLEX_NO_BULK=1`` forces blobs over libp2p (for comparison and for odd networks)."""
    return os.environ.get("GPUFLEX_NO_BULK", "") not in {"", "0"}
