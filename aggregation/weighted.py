"""Weighted averaging of model updates, batch and streaming.

Both forms accumulate ``sum(w_i * v_i)`` in float32 and divide once at the
end. float32 is a measured choice: on the development machine the blocked
float32 kernel runs at about memcpy speed while a float64 accumulator drops
to under half of it (see benchmarks/aggregation_speed.py), and the rounding
error of a float32 sum of n updates is at most about n * 6e-8 of the largest
update, far below the noise of SGD itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aggregation._checks import (
    BLOCK,
    as_vector,
    as_vectors,
    as_weights,
    blame_non_finite,
    blocks,
    check_number,
    output_is_finite,
)
from aggregation.errors import AggregationError


def weighted_mean(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """Return ``sum(w_i * v_i) / sum(w_i)`` as float32, in the vectors' shape.

    Weights are normalised here, so callers pass raw sample counts. The loop
    runs block-outer, vector-inner: the block of the result stays in cache
    while each input is read exactly once, and NaN/inf are caught on that
    cached block rather than by an extra pass over every input.
    """
    flat, shape = as_vectors(vectors, check_finite=False)
    raw = as_weights(weights, len(flat))
    w = raw / raw.sum()
    out = np.empty(flat[0].size, dtype=np.float32)
    scratch = np.empty(min(out.size, BLOCK), dtype=np.float32)
    for sl in blocks(out.size):
        acc = out[sl]
        tmp = scratch[: sl.stop - sl.start]
        np.multiply(flat[0][sl], np.float32(w[0]), out=acc)
        for vec, wi in zip(flat[1:], w[1:], strict=True):
            np.multiply(vec[sl], np.float32(wi), out=tmp)
            np.add(acc, tmp, out=acc)
        if not output_is_finite(acc):
            raise blame_non_finite(flat, "weighted mean")
    return out.reshape(shape)


class WeightedAccumulator:
    """Running weighted mean, so a leader can reduce each update as it lands.

    Streaming keeps memory at one model-sized buffer however many children a
    leader has, and overlaps reduction with the slowest peer's upload. Each
    ``add`` validates the whole vector (one fast SIMD pass) before touching
    the running sum, so a rejected update (wrong size, NaN) leaves the
    accumulator exactly as it was and the leader can drop just that peer.
    Writing into a second buffer instead was measured slower: the CPU reads
    a line before writing it, so it costs the same traffic plus a second
    model-sized allocation.
    """

    def __init__(self, size: int | None = None) -> None:
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise AggregationError(f"size must be a positive integer or None, got {size!r}")
        self._size = size
        self._shape: tuple[int, ...] | None = None
        self._acc: np.ndarray | None = None
        self._scratch: np.ndarray | None = None
        self._total = 0.0
        self._count = 0

    @property
    def total_weight(self) -> float:
        """Sum of the weights added so far (the weight of this partial one level up)."""
        return self._total

    @property
    def count(self) -> int:
        """Number of vectors added so far."""
        return self._count

    def add(self, vector: np.ndarray, weight: float) -> None:
        """Fold ``vector`` with ``weight`` into the running sum."""
        w = np.float32(check_number(weight, "weight", low=0.0))
        flat = as_vector(vector, "vector")
        shape = np.shape(vector)
        if self._size is not None and flat.size != self._size:
            raise AggregationError(f"vector has {flat.size} elements, expected {self._size}")
        if self._acc is None:
            self._acc = np.multiply(flat, w, dtype=np.float32)
            self._scratch = np.empty(min(flat.size, BLOCK), dtype=np.float32)
            self._shape = shape
        elif shape != self._shape:
            raise AggregationError(f"vector has shape {shape}, expected {self._shape}")
        elif w > 0:
            assert self._scratch is not None
            for sl in blocks(flat.size):
                tmp = self._scratch[: sl.stop - sl.start]
                np.multiply(flat[sl], w, out=tmp)
                np.add(self._acc[sl], tmp, out=self._acc[sl])
        self._total += float(w)
        self._count += 1

    def add_sparse(self, size: int, index: np.ndarray, values: np.ndarray, weight: float) -> None:
        """Fold a sparse vector (sorted unique ``index`` into ``size``, its ``values``) with
        ``weight``: a scatter into the running sum, no dense copy of the update."""
        w = np.float32(check_number(weight, "weight", low=0.0))
        if self._size is not None and size != self._size:
            raise AggregationError(f"vector has {size} elements, expected {self._size}")
        if index.shape != values.shape or (index.size and (index[0] < 0 or index[-1] >= size)):
            raise AggregationError("sparse vector has mismatched or out-of-range indices")
        if not np.isfinite(values).all():
            raise AggregationError("vector contains NaN or inf")
        if self._acc is None:
            self._acc = np.zeros(size, dtype=np.float32)
            self._shape = (size,)
        elif (size,) != self._shape:
            raise AggregationError(f"vector has shape {(size,)}, expected {self._shape}")
        if w > 0:
            self._acc[index] += values * w  # indices are unique, so one fancy add is exact
        self._total += float(w)
        self._count += 1

    def result(self) -> np.ndarray:
        """Return the weighted mean of everything added, as a new float32 array."""
        if self._acc is None or self._shape is None:
            raise AggregationError("no vector was added: nothing to average")
        if not self._total > 0:
            raise AggregationError("all weights added are zero: the mean is undefined")
        out = np.multiply(self._acc, np.float32(1.0 / self._total), dtype=np.float32)
        if not output_is_finite(out):
            raise AggregationError("weighted sum overflowed float32 (weights too large?)")
        return out.reshape(self._shape)
