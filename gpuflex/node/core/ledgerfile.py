"""A ledger's file: a header, then each committed round's signed frame, appended.

Only the bytes: which frames verify is ``ledger``'s to decide. A node used to rewrite the
whole file (and a copy of the one before) after every round; at a thousand members a round's
frame is a megabyte, so a round cost the whole ledger again, twice, and every frame was held
in memory too. Now a round appends its frame and fsyncs, and frames are read back from the
file on demand (``LedgerFrames``). An older node's file (format 1: one map holding every
frame) still reads; ``Ledger.load`` rewrites it in this format. An export for ``gpuflex
audit`` is format 1 (``export_bytes``): the form a ledger takes when it leaves the node.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, overload

import msgpack

from gpuflex.errors import GpuflexError
from mesh.codec import MAX_FRAME
from mesh.fsutil import StateWriteError

#: The file's format: a header map, then each round's frame as one msgpack bin.
FORMAT = 2
LEGACY = 1  # one map {"v": 1, "job": ..., "frames": [...]}, rewritten whole each round
log = logging.getLogger("gpuflex.ledger")
Span = tuple[int, int]  # a frame's offset in the file and its length


class LedgerError(GpuflexError, ValueError):
    """The ledger does not verify; the message names the round and the reason."""


class _Frames(Sequence[bytes]):
    """A sequence of signed frames that reads each one when asked for (``_read``)."""

    __slots__ = ()

    def _read(self, i: int) -> bytes:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        count = len(self)
        if isinstance(index, slice):
            return [self._read(i) for i in range(*index.indices(count))]
        i = index + count if index < 0 else index
        if not 0 <= i < count:
            raise IndexError("ledger round out of range")
        return self._read(i)

    def __iter__(self) -> Iterator[bytes]:
        return (self._read(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


class LedgerFrames(_Frames):
    """A ledger's signed frames, read from its file when asked for, not held in memory.

    Each view holds the file it was made from open, so a file replaced whole (a fork switch)
    leaves a view made before it reading the rounds it was made with; appends leave earlier
    rounds where they were."""

    __slots__ = ("_count", "_source", "_spans")

    def __init__(self, source: BinaryIO | bytes, spans: list[Span], count: int) -> None:
        self._source, self._spans, self._count = source, spans, count

    def __len__(self) -> int:
        return self._count

    def _read(self, i: int) -> bytes:
        offset, size = self._spans[i]
        if isinstance(self._source, bytes):
            return self._source[offset:offset + size]
        data = os.pread(self._source.fileno(), size, offset)  # no shared file position
        if len(data) != size:  # the file was cut behind this node's back
            raise LedgerError(f"round {i + 1}: the ledger file was cut short")
        return data


class ChainFrames(_Frames):
    """A peer's chain as a catch-up holds it: the first ``held`` rounds are this node's own
    (``ours``, a view read when asked for: a catch-up of a node a round behind a ledger of a
    thousand rounds need not read them), then the frames received after them."""

    __slots__ = ("_held", "_ours", "_tail")

    def __init__(self, ours: Sequence[bytes], held: int, tail: list[bytes]) -> None:
        self._ours, self._held, self._tail = ours, held, tail

    def __len__(self) -> int:
        return self._held + len(self._tail)

    def _read(self, i: int) -> bytes:
        return self._ours[i] if i < self._held else self._tail[i - self._held]


class FileScan:
    """Reads a ledger file's frames in order, for a caller that verifies each in turn.

    ``version`` is 0 where the file is not a ledger of ``job``, with ``problem`` saying why.
    Iterating yields each frame (``span`` None for format 1) until the file ends; a frame the
    caller takes (it asks for the next) moves ``end`` past it, so a caller that stops at a bad
    frame leaves ``end`` after the last good one. A file that does not parse, or ends in a torn
    write, sets ``problem``."""

    def __init__(self, f: BinaryIO, job: str) -> None:
        self._f = f
        self._unpacker = _unpacker(f)
        self.problem: str | None = None
        self.end = 0
        self.version = 0
        try:
            head = next(self._unpacker, None)
        except Exception as exc:  # a torn or foreign file may fail msgpack in any way
            self.problem = f"round ?: file cannot be read ({exc.__class__.__name__})"
            return
        if not isinstance(head, dict) or head.get("job") != job or head.get("v") not in (LEGACY, FORMAT):
            self.problem = f"round ?: not a ledger of job {job}"
            return
        self.version, self._head, self.end = head["v"], head, self._unpacker.tell()

    def __iter__(self) -> Iterator[tuple[Span | None, Any]]:
        taken = 0
        if self.version == LEGACY:
            frames = self._head.get("frames")
            if not isinstance(frames, list):
                self.problem = "round 1: no frames"
                return
            for frame in frames:
                yield None, frame
            return
        if self.version != FORMAT:
            return
        try:
            for frame in self._unpacker:
                after = self._unpacker.tell()
                yield ((after - len(frame), len(frame)) if isinstance(frame, bytes) else None), frame
                taken, self.end = taken + 1, after
        except Exception as exc:  # as above: the frames before it stand
            self.problem = f"round {taken + 1}: file cannot be read ({exc.__class__.__name__})"
            return
        if self.end != os.fstat(self._f.fileno()).st_size:
            self.problem = f"round {taken + 1}: the file ends in a torn write"


def _unpacker(f: BinaryIO) -> msgpack.Unpacker:
    return msgpack.Unpacker(f, raw=False, max_bin_len=MAX_FRAME, max_str_len=MAX_FRAME,
                            max_buffer_size=2 * MAX_FRAME)


def bin_header(size: int) -> int:
    """Bytes of msgpack's header for a bin of ``size`` bytes."""
    return 2 if size < 2**8 else 3 if size < 2**16 else 5


def packed(frames: Sequence[bytes], at: int) -> tuple[bytes, list[Span]]:
    """``frames`` as the file holds them, written at offset ``at``, and where each lies."""
    parts: list[bytes] = []
    spans: list[Span] = []
    for frame in frames:
        at += bin_header(len(frame))
        spans.append((at, len(frame)))
        parts.append(msgpack.packb(frame, use_bin_type=True))
        at += len(frame)
    return b"".join(parts), spans


def pack(job: str, frames: Sequence[bytes]) -> tuple[bytes, list[Span]]:
    """A whole ledger file of ``frames`` and where each frame lies in it."""
    header = msgpack.packb({"v": FORMAT, "job": job}, use_bin_type=True)
    data, spans = packed(frames, len(header))
    return header + data, spans


def append_frames(path: Path, end: int, frames: Sequence[bytes]) -> list[Span]:
    """Write ``frames`` at ``end`` of the file and fsync; the spans they took. A write that
    fails is cut off again (StateWriteError): the file holds what it held."""
    data, spans = packed(frames, end)
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise StateWriteError(exc.errno, f"could not write {path}: {exc.strerror or exc}") from exc
    try:
        view, at = memoryview(data), end
        while view:
            written = os.pwrite(fd, view, at)
            view, at = view[written:], at + written
        os.fsync(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, end)
        raise StateWriteError(exc.errno, f"could not write {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return spans


def cut(path: Path, end: int) -> int:
    """Cut the file at ``end`` (after its last verified round); where it ends now: 0 if it
    could not be cut, and the next write rewrites it whole."""
    try:
        os.truncate(path, end)
    except OSError as exc:
        log.warning("could not cut the bad tail off %s: %s", path, exc)
        return 0
    return end


def read_ledger_file(path: Path) -> list[bytes]:
    """The frames of a ledger file in either format, unverified (``verify_chain`` checks them);
    a torn last frame is left out, as ``Ledger.load`` leaves it."""
    try:
        with path.open("rb") as f:
            unpacker = _unpacker(f)
            head = next(unpacker)
            frames = head["frames"] if head["v"] == LEGACY else list(unpacker) if head["v"] == FORMAT else None
        if not isinstance(frames, list) or not all(isinstance(frame, bytes) for frame in frames):
            raise TypeError("frames")
    except Exception as exc:  # a torn or foreign file may fail msgpack in any way: it is unreadable
        raise LedgerError(f"round ?: file cannot be read ({exc.__class__.__name__})") from None
    return frames


def export_bytes(path: Path, job: str) -> bytes:
    """A ledger file as ``gpuflex audit`` reads it: the whole chain in one map (format 1)."""
    frames = read_ledger_file(path) if path.exists() else []
    return msgpack.packb({"v": LEGACY, "job": job, "frames": frames}, use_bin_type=True)
