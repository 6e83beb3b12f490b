"""Content-addressed blobs (model weights, deltas) on disk and over the wire.

Blobs are named by their BLAKE3-256 digest: BLAKE3 hashes several GB/s per core and releases
the GIL, where BLAKE2b's 0.9 GB/s held a fast transfer to a third of loopback TCP. A receiver
streams a blob to a temporary file in fixed-size chunks while hashing it, so memory stays
bounded whatever the size, and the blob only enters the store (by rename) once its hash
matches: a peer that serves wrong bytes is caught before anyone can use them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import trio

from mesh import bulk
from mesh.blobhash import HASH_HEX_LEN as HASH_HEX_LEN  # re-exported, as the four below
from mesh.blobhash import blob_hash as blob_hash
from mesh.blobhash import blob_hasher as blob_hasher
from mesh.blobhash import parts_hash as parts_hash
from mesh.blobhash import valid_hash as valid_hash
from mesh.codec import Truncated, WireError, WireReason
from mesh.errors import MeshError
from mesh.framing import Stalled, Stream, read_exactly, read_obj, write_obj
from mesh.limits import BulkGate
from mesh.push import await_verdict, dial_and_transfer

BLOB_PROTOCOL = "/gpuflex/blob/1.0.0"
CHUNK = 1 << 20
# A transfer that makes no progress this long is given up, so a cut link frees the caller
# long before the whole-transfer timeout.
STALL_S = 15.0
#: A server's answer for a blob it does not hold.
NOT_FOUND = "not found"

log = logging.getLogger(__name__)


class BlobError(MeshError, RuntimeError):
    """A blob could not be found, read or fetched."""


class BlobNotFound(BlobError):
    """The asked peer does not hold the blob (or not yet: a tree parent may still be fetching
    the model it will pass down), as opposed to a transfer that failed."""


class BlobIntegrityError(BlobError):
    """A peer served bytes whose hash does not match the one asked for."""

    def __init__(self, peer: str, expected: str, got: str) -> None:
        super().__init__(f"peer {peer} served wrong bytes for blob {expected[:16]}… (got {got[:16]}…)")
        self.peer = peer


class BlobStore:
    """A directory of immutable files named by content hash."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        if not valid_hash(digest):
            raise BlobError(f"not a blob hash: {digest!r}")
        return self.root / digest

    def has(self, digest: str) -> bool:
        return valid_hash(digest) and self.path(digest).exists()

    def size(self, digest: str) -> int:
        return self.path(digest).stat().st_size

    def put(self, data: bytes | memoryview) -> str:
        return self.put_parts([data])

    def put_parts(self, parts: Sequence[bytes | memoryview]) -> str:
        """Store the concatenation of ``parts`` without ever joining them in memory: a 100M
        model's blob is 400 MB or more, and joining it first would hold it twice."""
        digest = parts_hash(parts)
        target = self.path(digest)
        if not target.exists():
            tmp = target.with_name(f".{digest}.{os.getpid()}.tmp")
            try:
                with open(tmp, "wb") as fh:
                    for part in parts:
                        fh.write(part)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, target)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise BlobError(f"could not store blob {digest[:16]}…: {exc.strerror or exc}") from exc
        return digest

    def read(self, digest: str, verify: bool = True) -> bytes:
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError:
            raise BlobError(f"blob {digest[:16]}… is not in the local store") from None
        if verify and blob_hash(data) != digest:
            with contextlib.suppress(OSError):
                self.path(digest).unlink()
            raise BlobError(f"blob {digest[:16]}… was corrupt on disk and has been removed")
        return data

    def discard(self, digest: str) -> bool:
        """Remove a blob nobody needs any more; True if it was there. A transfer already
        serving it keeps its open file."""
        try:
            self.path(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    def chunks(self, digest: str) -> Iterator[bytes]:
        with open(self.path(digest), "rb") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk

    def incoming(self, digest: str, size: int | None = None) -> IncomingBlob:
        return IncomingBlob(self, digest, size)


class IncomingBlob:
    """A blob being received: hashed chunk by chunk, committed only if the hash matches."""

    def __init__(self, store: BlobStore, digest: str, size: int | None = None) -> None:
        self.store = store
        self.digest = digest
        self.target = store.path(digest)
        self.tmp = self.target.with_name(f".{digest}.{os.getpid()}.{id(self)}.part")
        self._hasher = blob_hasher()
        self._fh = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        self.received = 0
        self.expected = size
        if size:
            self._reserve(size)

    def _reserve(self, size: int) -> None:
        """Claim the disk space up front: a full disk fails before any byte moves, not midway,
        and writes into allocated blocks cost the filesystem less."""
        try:
            os.posix_fallocate(self._fh.fileno(), 0, size)
        except AttributeError:
            return  # not on this platform
        except OSError as exc:
            self.abort()
            if exc.errno in {errno.EOPNOTSUPP, errno.EINVAL}:
                self._fh = open(self.tmp, "wb")  # noqa: SIM115 - a filesystem without fallocate
                return
            raise BlobError(f"no room for blob {self.digest[:16]}… ({size} bytes): {exc.strerror or exc}") from None

    def write(self, chunk: bytes | memoryview) -> None:
        self._hasher.update(chunk)
        self._fh.write(chunk)
        self.received += len(chunk)

    def commit(self, peer: str) -> Path:
        self._fh.close()
        if self.expected is not None and self.received != self.expected:
            self.abort()
            raise Truncated(f"blob {self.digest[:16]}… ended after {self.received} of {self.expected} bytes",
                            self.received)
        got = self._hasher.hexdigest()
        if got != self.digest:
            self.abort()
            raise BlobIntegrityError(peer, self.digest, got)
        os.replace(self.tmp, self.target)
        return self.target

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._fh.close()
        with contextlib.suppress(OSError):
            self.tmp.unlink()


async def serve_blob(stream: Stream, store: BlobStore, max_request: int = 4096,
                     bulk_host: str | None = None, *, peer: str = "", gate: BulkGate | None = None,
                     stall_s: float | None = None) -> str | None:
    """Answer one blob request on ``stream``; returns the hash served, if any.

    With ``bulk_host`` set, a receiver that asks for it, and a listener free in ``gate``, the
    bytes go over a one-off side channel (``mesh.bulk``); the libp2p stream carries the offer
    and the verdict. On the stream, every read and write must make progress within
    ``stall_s``: a requester that stops reading frees the request.
    """
    request = await read_obj(stream, max_request, stall_s)
    digest = request.get("h") if isinstance(request, dict) else None
    if not valid_hash(digest):
        await write_obj(stream, {"ok": False, "error": "bad request"})
        raise WireError(WireReason.GARBLED, "blob request without a valid hash")
    if not store.has(digest):
        await write_obj(stream, {"ok": False, "error": NOT_FOUND})
        return None
    size = store.size(digest)
    opened = bulk_host is not None and bulk.choose_cipher(request.get("bulk")) is not None and (
        gate is None or gate.open(peer))
    try:
        sender = _open_bulk_sender(bulk_host, stream, request) if opened else None
        reply: dict[str, Any] = {"ok": True, "size": size}
        if sender is not None:
            reply["bulk"] = sender.offer.to_wire()
        await write_obj(stream, reply)
        threads = gate.threads if gate is not None else None
        if sender is None or not await _serve_bulk(stream, sender, store.path(digest), size, threads,
                                                   stall_s or bulk.IO_TIMEOUT_S):
            for chunk in store.chunks(digest):
                with trio.move_on_after(math.inf if stall_s is None else stall_s) as scope:
                    await stream.write(chunk)
                if scope.cancelled_caught:
                    raise Stalled(f"blob {digest[:16]}…: the requester took no byte for {stall_s:g} s", 1)
    finally:
        if opened and gate is not None:
            gate.close(peer)
    return digest


def _open_bulk_sender(bulk_host: str | None, stream: Stream, request: dict[str, Any]) -> bulk.BulkSender | None:
    cipher = bulk.choose_cipher(request.get("bulk")) if bulk_host else None
    if cipher is None or bulk_host is None:
        return None
    try:
        return bulk.BulkSender(bulk_host, bulk.peer_ip(stream), cipher)
    except bulk.BulkUnavailable as exc:
        log.info("blob served over libp2p: %s", exc)
        return None


async def _serve_bulk(stream: Stream, sender: bulk.BulkSender, path: Path, size: int,
                      threads: trio.CapacityLimiter | None, grace_s: float) -> bool:
    """Send over the side channel; False when the receiver asked for the libp2p stream instead."""
    ended = trio.Event()
    async with trio.open_nursery() as nursery:

        async def send() -> None:
            try:
                await trio.to_thread.run_sync(sender.serve, path, size, abandon_on_cancel=True,  # type: ignore[call-arg]  # mypy misreads trio's TypeVarTuple signature
                                              limiter=threads)
            except (bulk.BulkUnavailable, WireError, OSError) as exc:
                log.info("bulk send of %s stopped: %s", path.name[:12], exc)
            finally:
                ended.set()

        nursery.start_soon(send)
        try:
            verdict = await await_verdict(stream, ended, grace_s)
        except BaseException:
            sender.close()
            raise
        fallback = isinstance(verdict, dict) and bool(verdict.get("fallback"))
        if fallback:
            sender.close()
            nursery.cancel_scope.cancel()
    return not fallback


async def receive_blob(stream: Stream, store: BlobStore, digest: str, peer: str, max_size: int,
                       use_bulk: bool = True) -> tuple[Path, bool]:
    """Request ``digest`` on an open stream and store it after checking its hash.

    Returns the stored path and whether the bytes came over the bulk side channel.
    """
    request: dict[str, Any] = {"h": digest}
    if use_bulk:
        request["bulk"] = bulk.preferred_ciphers()
    await write_obj(stream, request)
    reply: Any = await read_obj(stream)
    if not isinstance(reply, dict) or not reply.get("ok"):
        err = reply.get("error", "refused") if isinstance(reply, dict) else "garbled reply"
        kind = BlobNotFound if err == NOT_FOUND else BlobError
        raise kind(f"peer {peer} does not serve blob {digest[:16]}…: {str(err)[:80]}")
    size = reply.get("size")
    if not isinstance(size, int) or size < 0 or size > max_size:
        raise WireError(WireReason.OVERSIZED, f"peer {peer} announced a blob of {size!r} bytes (limit {max_size})")
    incoming = store.incoming(digest, size)
    try:
        offer = reply.get("bulk")
        via_bulk = use_bulk and offer is not None and await _receive_bulk(stream, offer, incoming, size)
        if not via_bulk:
            remaining = size
            while remaining:
                with trio.move_on_after(STALL_S) as stall:
                    chunk = await read_exactly(stream, min(CHUNK, remaining))
                if stall.cancelled_caught:
                    raise Truncated(f"peer {peer} sent nothing for {STALL_S:g} s with "
                                    f"{remaining} of {size} bytes to go", size - remaining)
                incoming.write(chunk)
                remaining -= len(chunk)
        return incoming.commit(peer), via_bulk
    except BaseException:
        incoming.abort()
        raise


async def _receive_bulk(stream: Stream, wire_offer: object, incoming: IncomingBlob, size: int) -> bool:
    """Take the bytes over the side channel; False (after saying so) when it cannot be reached."""
    return await dial_and_transfer(stream, wire_offer, bulk.BulkReceiver,
                                   lambda receiver: receiver.receive(size, incoming.write), "blob fetched")
