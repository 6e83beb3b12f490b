"""Length-prefixed frames over libp2p streams.

py-libp2p's ``stream.read(n)`` may return fewer than ``n`` bytes and raises ``StreamEOF`` at
the end of a stream rather than returning ``b""``; these helpers hide both, and turn a peer
that stops early or announces an oversized frame into a ``WireError``.

What a peer announces is never allocated up front: ``read_growing`` keeps the bytes that have
arrived in a buffer that grows chunk by chunk, so announcing a gigabyte and sending nothing
costs nothing, and with ``stall_s`` a stream on which no byte arrives for that long ends with
``Stalled`` (bytes must keep arriving).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol

import msgpack
import trio

from mesh.codec import Truncated, WireError, WireReason

_LEN = struct.Struct(">I")
_LEN64 = struct.Struct(">Q")
#: The most one read asks for: a growing buffer gains at most this much per step.
CHUNK = 1 << 20


class Stream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...
    async def write(self, data: bytes) -> None: ...


class Stalled(WireError):
    """No byte arrived for the read timeout; ``received`` bytes of the item had arrived."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(WireReason.STALLED, message)
        self.received = received


def _is_eof(exc: BaseException) -> bool:
    return exc.__class__.__name__ in {"StreamEOF", "StreamClosed", "StreamReset", "MuxedStreamEOF",
                                      "MuxedStreamReset", "MuxedStreamClosed", "IncompleteReadError"}


async def _read_some(stream: Stream, n: int, what: str, got: int, total: int, stall_s: float | None) -> bytes:
    """One read of at most ``n`` bytes, within ``stall_s`` seconds when given (without, the
    caller's own deadline bounds it, and no cancel scope is made: a node reads several times
    per message, and a scope costs more than the read)."""
    scope: trio.CancelScope | None = None
    try:
        if stall_s is None:
            chunk = await stream.read(n)
        else:
            with trio.move_on_after(stall_s) as scope:
                chunk = await stream.read(n)
    except Exception as exc:  # py-libp2p's stream errors have no common base: EOF is told by name
        if _is_eof(exc):
            raise Truncated(f"{what} ended after {got} of {total} bytes", got) from None
        raise
    if scope is not None and scope.cancelled_caught:
        raise Stalled(f"{what}: no byte for {stall_s:g} s after {got} of {total} bytes", got)
    if not chunk:
        raise Truncated(f"{what} ended after {got} of {total} bytes", got)
    return chunk


async def read_exactly(stream: Stream, n: int, stall_s: float | None = None) -> bytes:
    buf = bytearray(n)
    await read_into(stream, memoryview(buf), "stream", stall_s)
    return bytes(buf)


async def read_into(stream: Stream, view: memoryview, what: str = "payload", stall_s: float | None = None) -> None:
    """Fill ``view`` completely from the stream (large payloads land without extra copies).
    Only for buffers this node sized itself; a size a peer announced goes to ``read_growing``."""
    got = 0
    total = len(view)
    while got < total:
        chunk = await _read_some(stream, min(total - got, CHUNK), what, got, total, stall_s)
        view[got : got + len(chunk)] = chunk
        got += len(chunk)


async def read_growing(stream: Stream, size: int, what: str = "payload", stall_s: float | None = None,
                       charge: Callable[[int], None] | None = None) -> bytes:
    """``size`` bytes a peer announced, held only as they arrive. ``charge(n)`` is told of each
    chunk before it is kept, and may refuse it by raising."""
    buf = bytearray()
    while len(buf) < size:
        chunk = await _read_some(stream, min(size - len(buf), CHUNK), what, len(buf), size, stall_s)
        if charge is not None:
            charge(len(chunk))
        buf += chunk
    return bytes(buf)


async def write_frame(stream: Stream, data: bytes) -> None:
    await stream.write(_LEN.pack(len(data)) + data)


async def read_frame(stream: Stream, max_size: int, stall_s: float | None = None,
                     charge: Callable[[int], None] | None = None) -> bytes:
    (size,) = _LEN.unpack(await read_exactly(stream, _LEN.size, stall_s))
    if size > max_size:
        raise WireError(WireReason.OVERSIZED, f"peer announced a {size} byte frame; the limit is {max_size}")
    return await read_growing(stream, size, "frame", stall_s, charge)


async def write_obj(stream: Stream, obj: Any) -> None:
    """A small unsigned control frame (requests, acks) inside an already authenticated stream."""
    await write_frame(stream, msgpack.packb(obj, use_bin_type=True))


async def read_obj(stream: Stream, max_size: int = 64 * 1024, stall_s: float | None = None) -> Any:
    raw = await read_frame(stream, max_size, stall_s)
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=max_size,
                               max_str_len=max_size, max_array_len=4096, max_map_len=4096)
    except Exception as exc:  # untrusted bytes may fail msgpack in any way
        raise WireError(WireReason.GARBLED, f"control frame could not be decoded ({exc.__class__.__name__})") from None


async def write_len64(stream: Stream, size: int) -> None:
    await stream.write(_LEN64.pack(size))


async def read_len64(stream: Stream, stall_s: float | None = None) -> int:
    (size,) = _LEN64.unpack(await read_exactly(stream, _LEN64.size, stall_s))
    return size
