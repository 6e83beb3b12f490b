"""Content-addressed blobs (model weights, deltas) on disk and over the wire.

Blobs are named by their BLAKE2b-256 digest. A receiver streams a blob to a temporary file in
fixed-size chunks while hashing it, so memory stays bounded whatever the size, and the blob
only enters the store (by rename) once its hash matches: a peer that serves wrong bytes is
caught before anyone can use them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mesh.codec import WireError
from mesh.framing import Stream, read_exactly, read_obj, write_obj

BLOB_PROTOCOL = "/gpuflex/blob/1.0.0"
CHUNK = 1 << 20
HASH_HEX_LEN = 64


class BlobError(RuntimeError):
    """A blob could not be found, read or fetched."""


class BlobIntegrityError(BlobError):
    """A peer served bytes whose hash does not match the one asked for."""

    def __init__(self, peer: str, expected: str, got: str) -> None:
        super().__init__(f"peer {peer} served wrong bytes for blob {expected[:16]}… (got {got[:16]}…)")
        self.peer = peer


def blob_hash(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def valid_hash(text: object) -> bool:
    return isinstance(text, str) and len(text) == HASH_HEX_LEN and all(c in "0123456789abcdef" for c in text)


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
        digest = blob_hash(data)
        target = self.path(digest)
        if not target.exists():
            tmp = target.with_name(f".{digest}.{os.getpid()}.tmp")
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
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

    def chunks(self, digest: str) -> Iterator[bytes]:
        with open(self.path(digest), "rb") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk

    def incoming(self, digest: str) -> IncomingBlob:
        return IncomingBlob(self, digest)


class IncomingBlob:
    """A blob being received: hashed chunk by chunk, committed only if the hash matches."""

    def __init__(self, store: BlobStore, digest: str) -> None:
        self.store = store
        self.digest = digest
        self.target = store.path(digest)
        self.tmp = self.target.with_name(f".{digest}.{os.getpid()}.{id(self)}.part")
        self._hasher = hashlib.blake2b(digest_size=32)
        self._fh = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        self.received = 0

    def write(self, chunk: bytes) -> None:
        self._hasher.update(chunk)
        self._fh.write(chunk)
        self.received += len(chunk)

    def commit(self, peer: str) -> Path:
        self._fh.close()
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


async def serve_blob(stream: Stream, store: BlobStore, max_request: int = 4096) -> str | None:
    """Answer one blob request on ``stream``; returns the hash served, if any."""
    request = await read_obj(stream, max_request)
    digest = request.get("h") if isinstance(request, dict) else None
    if not valid_hash(digest):
        await write_obj(stream, {"ok": False, "error": "bad request"})
        raise WireError("garbled", "blob request without a valid hash")
    if not store.has(digest):
        await write_obj(stream, {"ok": False, "error": "not found"})
        return None
    await write_obj(stream, {"ok": True, "size": store.size(digest)})
    for chunk in store.chunks(digest):
        await stream.write(chunk)
    return digest


async def receive_blob(stream: Stream, store: BlobStore, digest: str, peer: str, max_size: int) -> Path:
    """Request ``digest`` on an open stream and store it after checking its hash."""
    await write_obj(stream, {"h": digest})
    reply: Any = await read_obj(stream)
    if not isinstance(reply, dict) or not reply.get("ok"):
        err = reply.get("error", "refused") if isinstance(reply, dict) else "garbled reply"
        raise BlobError(f"peer {peer} does not serve blob {digest[:16]}…: {err}")
    size = reply.get("size")
    if not isinstance(size, int) or size < 0 or size > max_size:
        raise WireError("oversized", f"peer {peer} announced a blob of {size!r} bytes (limit {max_size})")
    incoming = store.incoming(digest)
    try:
        remaining = size
        while remaining:
            chunk = await read_exactly(stream, min(CHUNK, remaining))
            incoming.write(chunk)
            remaining -= len(chunk)
        return incoming.commit(peer)
    except BaseException:
        incoming.abort()
        raise
