"""How a delta is prepared by a member and combined by a leader: the job's aggregation pipeline.

The round driver only moves bytes and signatures; everything about the numbers lives here:
the wire codec (none, fp16, int8, top-k), and the reducer a collector folds updates into
(a streaming weighted mean by default). Keeping this seam narrow lets the job file choose the
math without touching the protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from aggregation.compression import decode_delta, make_codec
from aggregation.errors import AggregationError
from aggregation.weighted import WeightedAccumulator
from mesh.codec import WireError

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec


class Reducer(Protocol):
    """Folds (vector, weight) pairs; ``result`` is the combined vector."""

    @property
    def count(self) -> int: ...

    def add(self, vector: np.ndarray, weight: float, reporter: str) -> None: ...

    def result(self) -> np.ndarray: ...


class MeanReducer:
    """Sample-weighted mean, folded as updates arrive (no buffering)."""

    def __init__(self) -> None:
        self._acc = WeightedAccumulator()

    @property
    def count(self) -> int:
        return self._acc.count

    def add(self, vector: np.ndarray, weight: float, reporter: str) -> None:
        self._acc.add(vector, weight)

    def result(self) -> np.ndarray:
        return self._acc.result()


def make_reducer(spec: JobSpec, is_root: bool) -> Reducer:
    return MeanReducer()


class DeltaEncoder:
    """A member's side: turns its delta into wire bytes with the job's codec."""

    def __init__(self, spec: JobSpec) -> None:
        self.codec = make_codec(spec.codec) if spec.codec != "none" else None

    def encode(self, delta: np.ndarray) -> bytes:
        if self.codec is None:
            return np.ascontiguousarray(delta, dtype="<f4").tobytes()
        return self.codec.encode(np.ascontiguousarray(delta, dtype=np.float32)).to_bytes()


def decode_payload(spec: JobSpec, payload: bytes, size: int) -> np.ndarray:
    """A leader's side: wire bytes back to a float32 vector of ``size`` entries."""
    if spec.codec == "none":
        if len(payload) != size * 4:
            raise WireError("garbled", f"delta has {len(payload)} bytes, expected {size * 4}")
        return np.frombuffer(payload, dtype="<f4").astype(np.float32, copy=False)
    try:
        vec = decode_delta(payload)
    except AggregationError as exc:
        raise WireError("garbled", f"delta could not be decoded: {exc}") from None
    if vec.size != size or not np.all(np.isfinite(vec)):
        raise WireError("garbled", "decoded delta has the wrong size or non-finite values")
    return vec
