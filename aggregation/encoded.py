"""An encoded delta and its self-describing byte format.

Deltas cross the network from peers we do not trust, so the format is
parsed, never unpickled: a fixed header, the codec's payload, then a few
named numpy arrays (block scales, top-k indices) whose dtype comes from a
short allow-list. Every length is checked before it is used, and anything
truncated, oversized or unknown is an AggregationError.

Layout, little-endian::

    b"GFXD" | version u8 | codec-name len u8 | codec name (ascii)
    | size u64 | payload len u64 | payload
    | meta count u8 | per meta: name len u8 | name | dtype len u8 | dtype str
                              | ndim u8 | dims u64 * ndim | raw array bytes
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from aggregation.errors import AggregationError

MAGIC = b"GFXD"
VERSION = 1
_ALLOWED_DTYPES = frozenset({"<f4", "<f2", "|i1", "|u1", "<u2", "<i4", "<i8", "<u4", "<u8"})
_U8 = struct.Struct("<B")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class EncodedDelta:
    """A compressed 1-D float32 vector of ``size`` elements.

    ``payload`` holds the codec's main buffer; ``meta`` holds its small side
    arrays. ``codec`` names the codec that can decode it, so a receiver needs
    nothing else (see aggregation.compression.decode_delta).
    """

    codec: str
    size: int
    payload: bytes | memoryview  # a codec may hand over its array's buffer without a copy
    meta: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of data on the wire, not counting the few header bytes."""
        return len(self.payload) + sum(int(a.nbytes) for a in self.meta.values())

    def to_bytes(self) -> bytes:
        """Serialise to the self-describing layout in the module docstring."""
        name = self.codec.encode("ascii")
        parts: list[bytes | memoryview] = [MAGIC, _U8.pack(VERSION), _U8.pack(len(name)), name]
        parts += [_U64.pack(self.size), _U64.pack(len(self.payload)), self.payload]
        parts.append(_U8.pack(len(self.meta)))
        for key, value in self.meta.items():
            arr = np.ascontiguousarray(value)
            arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
            dtype = arr.dtype.str.encode("ascii")
            if arr.dtype.str not in _ALLOWED_DTYPES:
                raise AggregationError(f"meta {key!r} has unsupported dtype {arr.dtype.str}")
            key_b = key.encode("ascii")
            parts += [_U8.pack(len(key_b)), key_b, _U8.pack(len(dtype)), dtype]
            parts.append(_U8.pack(arr.ndim))
            parts += [_U64.pack(dim) for dim in arr.shape]
            parts.append(arr.tobytes())
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> EncodedDelta:
        """Parse ``to_bytes`` output; any malformed input raises AggregationError."""
        reader = _Reader(memoryview(data).cast("B"))
        if reader.take(len(MAGIC)) != MAGIC:
            raise AggregationError("not an encoded delta (bad magic)")
        version = reader.u8()
        if version != VERSION:
            raise AggregationError(f"unsupported encoded-delta version {version}")
        codec = reader.text(reader.u8())
        size = reader.u64()
        payload = bytes(reader.take(reader.u64()))
        meta: dict[str, np.ndarray] = {}
        for _ in range(reader.u8()):
            key = reader.text(reader.u8())
            dtype_str = reader.text(reader.u8())
            if dtype_str not in _ALLOWED_DTYPES:
                raise AggregationError(f"meta {key!r} has unsupported dtype {dtype_str!r}")
            dtype = np.dtype(dtype_str)
            shape = tuple(reader.u64() for _ in range(reader.u8()))
            raw = reader.take(math.prod(shape) * dtype.itemsize)
            meta[key] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if reader.remaining:
            raise AggregationError(f"{reader.remaining} trailing bytes after encoded delta")
        return cls(codec=codec, size=size, payload=payload, meta=meta)


class _Reader:
    """Bounds-checked cursor over a byte buffer."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._view) - self._pos

    def take(self, count: int) -> memoryview:
        if count > self.remaining:
            raise AggregationError(
                f"encoded delta truncated: need {count} bytes at offset {self._pos}, "
                f"have {self.remaining}"
            )
        chunk = self._view[self._pos : self._pos + count]
        self._pos += count
        return chunk

    def u8(self) -> int:
        return int(_U8.unpack(self.take(1))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self.take(8))[0])

    def text(self, count: int) -> str:
        try:
            return bytes(self.take(count)).decode("ascii")
        except UnicodeDecodeError:
            raise AggregationError("encoded delta has a non-ascii name") from None
