"""A sparse, low-bit codec: top-k per chunk, b-bit values with a per-chunk scale.

A home uplink moves a few MB/s, so a delta must shrink by two orders of magnitude, not the
4x of int8. Following SparseLoCo (arXiv 2508.15706), the flat vector is cut into chunks of
``chunk`` values; in each, the ``ceil(density * len)`` largest magnitudes are kept. Their
offsets inside the chunk take ``ceil(log2(chunk))`` bits each (12 for 4096), and their values
are rounded to one of ``2**bits`` evenly spaced levels ``(c - L) * scale`` with
``L = (2**bits - 1) / 2`` and ``scale = absmax / L`` per chunk, so a kept value is off by at
most ``scale / 2 = absmax / (2**bits - 1)``. ``bits = 32`` keeps the values as float32
(lossless for what is kept). With ErrorFeedback, what top-k and rounding drop is carried
into the member's next update.

``transform = "dct"`` first applies an orthonormal DCT-II to each full chunk, as DeMo
(arXiv 2411.19870) does, and keeps the top-k coefficients; the ragged tail stays as it is.

The same format with a variable count per chunk carries a vector that is already sparse (a
sum of sparse updates, the root's step): ``encode_nonzero`` keeps every nonzero.

Wire layout (an EncodedDelta named "sparse"): ``payload`` is the value codes packed at
``bits`` bits each (or float32); meta ``cfg`` = [chunk, bits, transform], ``count`` (<u2,
kept per chunk), ``scale`` (<f4 per chunk, absent at 32 bits), ``offset`` (|u1, offsets packed
at the chunk's width). A receiver checks every length against the others before it trusts
any: counts within their chunk, offsets inside it and strictly increasing (no duplicates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache

import numpy as np

from aggregation._checks import as_vector, check_int, check_number
from aggregation.encoded import EncodedDelta
from aggregation.errors import AggregationError

__all__ = [
    "MAX_CHUNK",
    "SPARSE_BITS",
    "SparseCodec",
    "SparseVector",
    "Transform",
    "decode_sparse",
    "encode_nonzero",
]

#: Value widths: 2-4 bits for updates, 8 for a finer step, 32 for float32 (lossless).
SPARSE_BITS = (2, 3, 4, 8, 32)
#: Counts per chunk travel as uint16, so a chunk holds at most this many values.
MAX_CHUNK = 32768
#: The DCT is a dense chunk x chunk matrix product: bounded so its matrix stays small.
MAX_DCT_CHUNK = 1024
#: Entries bit-packed at a time (a multiple of 8, so every piece ends on a byte).
_PACK_PIECE = 1 << 20
_TINY = np.finfo(np.float32).tiny


class Transform(IntEnum):
    """What is applied to each chunk before top-k (its number travels in ``cfg``)."""

    NONE = 0
    DCT = 1


@dataclass(frozen=True)
class SparseVector:
    """A decoded sparse vector: sorted unique ``index`` into ``size`` and its ``values``.

    Leaders fold these into their running sum without building a dense copy per update.
    """

    size: int
    index: np.ndarray  # int64, strictly increasing, < size
    values: np.ndarray  # float32, same length

    def dense(self) -> np.ndarray:
        out = np.zeros(self.size, dtype=np.float32)
        out[self.index] = self.values
        return out

    @property
    def norm(self) -> float:
        return float(np.sqrt(np.dot(self.values.astype(np.float64), self.values.astype(np.float64))))


@lru_cache(maxsize=4)
def _dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix: rows are the basis, so x = D.T @ (D @ x)."""
    k = np.arange(n)[:, None]
    m = np.arange(n)[None, :]
    mat = np.sqrt(2.0 / n) * np.cos(np.pi * (m + 0.5) * k / n)
    mat[0] /= np.sqrt(2.0)
    return mat.astype(np.float32)


def _width(chunk: int) -> int:
    return max(1, (chunk - 1).bit_length())


def _pack(codes: np.ndarray, width: int) -> bytes:
    """Little-endian bit packing of unsigned ints below 2**width, a piece at a time."""
    out: list[bytes] = []
    shifts = np.arange(width, dtype=np.uint32)
    for start in range(0, codes.size, _PACK_PIECE):
        piece = codes[start : start + _PACK_PIECE].astype(np.uint32)
        bits = ((piece[:, None] >> shifts) & 1).astype(np.uint8)
        out.append(np.packbits(bits.reshape(-1), bitorder="little").tobytes())
    return b"".join(out)


def _unpack(buf: bytes | memoryview, count: int, width: int) -> np.ndarray:
    if len(buf) != math.ceil(count * width / 8):
        raise AggregationError(f"sparse delta has {len(buf)} packed bytes for {count} entries of {width} bits")
    raw = np.frombuffer(buf, dtype=np.uint8)
    out = np.empty(count, dtype=np.int64)
    shifts = np.arange(width, dtype=np.int64)
    for start in range(0, count, _PACK_PIECE):
        n = min(_PACK_PIECE, count - start)
        first = start * width // 8
        bits = np.unpackbits(raw[first:], count=n * width, bitorder="little").reshape(n, width)
        out[start : start + n] = (bits.astype(np.int64) << shifts).sum(axis=1)
    return out


def _chunk_ids(counts: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(counts.size, dtype=np.int64), counts)


def _quantise(values: np.ndarray, counts: np.ndarray, bits: int) -> tuple[bytes, np.ndarray | None]:
    """Codes and per-chunk scales for values grouped by chunk (``counts`` per chunk)."""
    if bits == 32:
        return values.astype("<f4").tobytes(), None
    half = (2**bits - 1) / 2
    ids = _chunk_ids(counts)
    absmax = np.zeros(counts.size, dtype=np.float32)
    np.maximum.at(absmax, ids, np.abs(values))
    # A chunk whose scale would be subnormal is sent as zeros: 1/scale would overflow, and
    # values below ~1e-38 are negligible.
    scale = np.where(absmax >= np.float32(half) * _TINY, absmax / np.float32(half), 0).astype(np.float32)
    inv = np.divide(1, scale, out=np.zeros_like(scale), where=scale > 0)
    codes = np.clip(np.rint(values * inv[ids] + half), 0, 2**bits - 1).astype(np.uint32)
    return _pack(codes, bits), scale


def _dequantise(payload: bytes | memoryview, counts: np.ndarray, scale: np.ndarray | None,
                bits: int, total: int) -> np.ndarray:
    if bits == 32:
        if len(payload) != 4 * total:
            raise AggregationError(f"sparse delta has {len(payload)} value bytes, expected {4 * total}")
        return np.frombuffer(payload, dtype="<f4").astype(np.float32)
    assert scale is not None
    half = (2**bits - 1) / 2
    codes = _unpack(payload, total, bits)
    return ((codes.astype(np.float32) - np.float32(half)) * scale[_chunk_ids(counts)]).astype(np.float32)


def _encode(size: int, chunk: int, bits: int, transform: Transform, index: np.ndarray,
            values: np.ndarray) -> EncodedDelta:
    """The wire form of sorted unique ``index`` / ``values`` of a vector of ``size``."""
    chunks = -(-size // chunk)
    ids = index // chunk
    counts = np.bincount(ids, minlength=chunks).astype("<u2")
    offsets = (index - ids * chunk).astype(np.uint32)
    payload, scale = _quantise(values.astype(np.float32), counts.astype(np.int64), bits)
    meta: dict[str, np.ndarray] = {"cfg": np.array([chunk, bits, int(transform)], dtype="<i8"),
                                   "count": counts,
                                   "offset": np.frombuffer(_pack(offsets, _width(chunk)), dtype=np.uint8)}
    if scale is not None:
        meta["scale"] = scale.astype("<f4")
    return EncodedDelta("sparse", size, payload, meta)


def _meta(enc: EncodedDelta, key: str, dtype: str) -> np.ndarray:
    arr = enc.meta.get(key)
    if arr is None or arr.dtype.str != dtype or arr.ndim != 1:
        raise AggregationError(f"sparse delta needs a 1-D {dtype} meta array {key!r}")
    return arr


def decode_sparse(enc: EncodedDelta) -> tuple[SparseVector, Transform, int]:
    """Check every length and index of ``enc`` and return its entries (still in the
    transform's domain), the transform and the chunk size. Hostile input raises
    AggregationError: nothing is allocated from a claimed size before it is checked
    against the bytes that arrived."""
    if enc.codec != "sparse":
        raise AggregationError(f"delta was encoded with {enc.codec!r}, not 'sparse'")
    cfg = _meta(enc, "cfg", "<i8")
    if cfg.size != 3:
        raise AggregationError("sparse delta cfg must be [chunk, bits, transform]")
    chunk, bits, tr = (int(v) for v in cfg)
    if not 1 <= chunk <= MAX_CHUNK or bits not in SPARSE_BITS or tr not in (t.value for t in Transform):
        raise AggregationError(f"sparse delta has an unsupported cfg {cfg.tolist()}")
    transform = Transform(tr)
    if transform is Transform.DCT and chunk > MAX_DCT_CHUNK:
        raise AggregationError(f"sparse delta's DCT chunk {chunk} exceeds {MAX_DCT_CHUNK}")
    size = enc.size
    chunks = -(-size // chunk) if size >= 1 else 0
    counts = _meta(enc, "count", "<u2").astype(np.int64)
    if size < 1 or counts.size != chunks:
        raise AggregationError(f"sparse delta of size {size} has {counts.size} chunk counts, expected {chunks}")
    lengths = np.full(chunks, chunk, dtype=np.int64)
    lengths[-1] = size - (chunks - 1) * chunk
    if (counts > lengths).any():
        raise AggregationError("sparse delta claims more entries in a chunk than the chunk holds")
    total = int(counts.sum())
    scale = None
    if bits != 32:
        scale = _meta(enc, "scale", "<f4")
        if scale.size != chunks or not np.isfinite(scale).all() or (scale < 0).any():
            raise AggregationError("sparse delta has a bad scale array")
    offsets = _unpack(_meta(enc, "offset", "|u1").tobytes(), total, _width(chunk))
    ids = _chunk_ids(counts)
    if (offsets >= lengths[ids]).any():
        raise AggregationError("sparse delta has an index out of range")
    index = ids * chunk + offsets
    if total > 1 and not (np.diff(index) > 0).all():
        raise AggregationError("sparse delta has duplicate or unsorted indices")
    values = _dequantise(enc.payload, counts, scale, bits, total)
    if not np.isfinite(values).all():
        raise AggregationError("sparse delta contains NaN or inf")
    return SparseVector(size, index, values), transform, chunk


def _inverse(vec: SparseVector, transform: Transform, chunk: int) -> np.ndarray:
    """Dense vector back in the parameters' domain."""
    out = vec.dense()
    if transform is Transform.DCT:
        full = vec.size // chunk * chunk
        if full:
            grid = out[:full].reshape(-1, chunk)
            out[:full] = (grid @ _dct_matrix(chunk)).reshape(-1)
    return out


def to_sparse(enc: EncodedDelta) -> SparseVector:
    """A sparse delta as a SparseVector in the parameters' domain: no dense copy unless a
    transform makes the result dense."""
    vec, transform, chunk = decode_sparse(enc)
    if transform is Transform.NONE:
        return vec
    dense = _inverse(vec, transform, chunk)
    index = np.flatnonzero(dense)
    return SparseVector(vec.size, index, dense[index])


@dataclass(frozen=True)
class SparseCodec:
    """Top-k per chunk with b-bit values (see the module docstring for the error bound)."""

    density: float = 1 / 64
    bits: int = 2
    chunk: int = 4096
    transform: str = "none"
    name: str = field(default="sparse", init=False)

    def __post_init__(self) -> None:
        check_number(self.density, "density", low=0.0, high=1.0, low_open=True)
        check_int(self.chunk, "chunk", low=1)
        if self.chunk > MAX_CHUNK:
            raise AggregationError(f"chunk must be at most {MAX_CHUNK}, got {self.chunk}")
        if self.bits not in SPARSE_BITS:
            raise AggregationError(f"bits must be one of {SPARSE_BITS}, got {self.bits!r}")
        if self.transform not in ("none", "dct"):
            raise AggregationError(f"transform must be 'none' or 'dct', got {self.transform!r}")
        if self.transform == "dct" and self.chunk > MAX_DCT_CHUNK:
            raise AggregationError(f"a DCT chunk must be at most {MAX_DCT_CHUNK}, got {self.chunk}")

    @property
    def _transform(self) -> Transform:
        return Transform.DCT if self.transform == "dct" else Transform.NONE

    def kept(self, length: int) -> int:
        """Entries kept from a chunk of ``length`` values."""
        return min(length, max(1, math.ceil(self.density * length)))

    def encode(self, vec: np.ndarray) -> EncodedDelta:
        flat = as_vector(vec, "delta")
        size, chunk = flat.size, self.chunk
        full = size // chunk * chunk
        parts_i: list[np.ndarray] = []
        parts_v: list[np.ndarray] = []
        if full:
            grid = flat[:full].reshape(-1, chunk)
            if self._transform is Transform.DCT:
                grid = grid @ _dct_matrix(chunk).T
            k = self.kept(chunk)
            top = np.argpartition(np.abs(grid), chunk - k, axis=1)[:, chunk - k :]
            top.sort(axis=1)
            parts_v.append(np.take_along_axis(grid, top, axis=1).reshape(-1))
            parts_i.append((top + np.arange(0, full, chunk)[:, None]).reshape(-1))
        if full < size:
            tail = flat[full:]
            k = self.kept(tail.size)
            top = np.sort(np.argpartition(np.abs(tail), tail.size - k)[tail.size - k :])
            parts_v.append(tail[top])
            parts_i.append(top + full)
        index = np.concatenate(parts_i).astype(np.int64)
        values = np.concatenate(parts_v).astype(np.float32)
        return _encode(size, chunk, self.bits, self._transform, index, values)

    def decode(self, enc: EncodedDelta) -> np.ndarray:
        vec, transform, chunk = decode_sparse(enc)
        return _inverse(vec, transform, chunk)


def encode_nonzero(vec: np.ndarray | SparseVector, bits: int = 32, chunk: int = 4096,
                   transform: Transform = Transform.NONE) -> EncodedDelta:
    """Every nonzero of an already sparse vector (a sum of sparse updates, a step), in the
    same format with a count per chunk; ``bits = 32`` is lossless. ``transform`` says which
    domain ``vec`` is in (DCT coefficients decode back through the inverse DCT)."""
    if bits not in SPARSE_BITS:
        raise AggregationError(f"bits must be one of {SPARSE_BITS}, got {bits!r}")
    if not 1 <= chunk <= MAX_CHUNK:
        raise AggregationError(f"chunk must be within 1..{MAX_CHUNK}, got {chunk}")
    if isinstance(vec, SparseVector):
        keep = vec.values != 0
        return _encode(vec.size, chunk, bits, transform, vec.index[keep], vec.values[keep])
    flat = as_vector(vec, "delta")
    index = np.flatnonzero(flat)
    return _encode(flat.size, chunk, bits, transform, index, flat[index])
