"""Length-prefixed frames over libp2p streams.

py-libp2p's ``stream.read(n)`` may return fewer than ``n`` bytes and raises ``StreamEOF`` at
the end of a stream rather than returning ``b""``; these helpers hide both, and turn a peer
that stops early or announces an oversized frame into a ``WireError``.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

import msgpack

from mesh.codec import Truncated, WireError

_LEN = struct.Struct(">I")
_LEN64 = struct.Struct(">Q")


class Stream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...
    async def write(self, data: bytes) -> None: ...


def _is_eof(exc: BaseException) -> bool:
    return exc.__class__.__name__ in {"StreamEOF", "StreamClosed", "StreamReset", "MuxedStreamEOF",
                                      "MuxedStreamReset", "MuxedStreamClosed", "IncompleteReadError"}


async def read_exactly(stream: Stream, n: int) -> bytes:
    buf = bytearray(n)
    await read_into(stream, memoryview(buf), "stream")
    return bytes(buf)


async def read_into(stream: Stream, view: memoryview, what: str = "payload") -> None:
    """Fill ``view`` completely from the stream (large payloads land without extra copies)."""
    got = 0
    total = len(view)
    while got < total:
        try:
            chunk = await stream.read(min(total - got, 1 << 20))
        except Exception as exc:  # py-libp2p's stream errors have no common base: EOF is told by name
            if _is_eof(exc):
                raise Truncated(f"{what} ended after {got} of {total} bytes", got) from None
            raise
        if not chunk:
            raise Truncated(f"{what} ended after {got} of {total} bytes", got)
        view[got : got + len(chunk)] = chunk
        got += len(chunk)


async def write_frame(stream: Stream, data: bytes) -> None:
    await stream.write(_LEN.pack(len(data)) + data)


async def read_frame(stream: Stream, max_size: int) -> bytes:
    (size,) = _LEN.unpack(await read_exactly(stream, _LEN.size))
    if size > max_size:
        raise WireError("oversized", f"peer announced a {size} byte frame; the limit is {max_size}")
    return await read_exactly(stream, size)


async def write_obj(stream: Stream, obj: Any) -> None:
    """A small unsigned control frame (requests, acks) inside an already authenticated stream."""
    await write_frame(stream, msgpack.packb(obj, use_bin_type=True))


async def read_obj(stream: Stream, max_size: int = 64 * 1024) -> Any:
    raw = await read_frame(stream, max_size)
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=max_size,
                               max_str_len=max_size, max_array_len=4096, max_map_len=4096)
    except Exception as exc:  # untrusted bytes may fail msgpack in any way
        raise WireError("garbled", f"control frame could not be decoded ({exc.__class__.__name__})") from None


async def write_len64(stream: Stream, size: int) -> None:
    await stream.write(_LEN64.pack(size))


async def read_len64(stream: Stream) -> int:
    (size,) = _LEN64.unpack(await read_exactly(stream, _LEN64.size))
    return size
