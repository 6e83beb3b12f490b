"""Coordinate-wise robust rules: median and trimmed mean.

Each coordinate is treated on its own, so one peer's wild value in one
coordinate cannot move the others. The rules work on cache-sized column
blocks, so memory stays at one block per input whatever the model size, and
they count each peer once: ``weights`` is checked for a uniform call
signature but not used (see aggregation.robust).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from aggregation._checks import as_vectors, as_weights, blocks, check_number
from aggregation._sortnet import sort_rows

_Reducer = Callable[[list[np.ndarray], np.ndarray], None]

#: Column block for the coordinate-wise rules: 2**16 float32 per input keeps
#: n + 1 blocks in L2 for the group sizes we expect.
_COLUMNS = 1 << 16


def _coordinatewise(vectors: Sequence[np.ndarray], reduce: _Reducer) -> np.ndarray:
    """Sort each column block element-wise and let ``reduce`` fill the output block."""
    flat, shape = as_vectors(vectors)
    size = flat[0].size
    out = np.empty(size, dtype=np.float32)
    work = np.empty((len(flat) + 1, min(size, _COLUMNS)), dtype=np.float32)
    for sl in blocks(size, _COLUMNS):
        width = sl.stop - sl.start
        rows = [work[i, :width] for i in range(len(flat))]
        for row, vec in zip(rows, flat, strict=True):
            np.copyto(row, vec[sl])
        reduce(sort_rows(rows, work[-1, :width]), out[sl])
    return out.reshape(shape)


def _mean_of_rows(rows: list[np.ndarray], out: np.ndarray) -> None:
    np.copyto(out, rows[0])
    for row in rows[1:]:
        np.add(out, row, out=out)
    np.multiply(out, np.float32(1.0 / len(rows)), out=out)


def coordinate_median(
    vectors: Sequence[np.ndarray], weights: Sequence[float] | None = None
) -> np.ndarray:
    """Per-coordinate median (mean of the two middle values for even n)."""
    as_weights(weights, len(vectors))

    def reduce(rows: list[np.ndarray], out: np.ndarray) -> None:
        mid = len(rows) // 2
        lo = mid - 1 if len(rows) % 2 == 0 else mid
        _mean_of_rows(rows[lo : mid + 1], out)

    return _coordinatewise(vectors, reduce)


def check_beta(beta: float) -> float:
    """beta < 0.5 so that at least one value per coordinate survives trimming."""
    return check_number(beta, "beta", low=0.0, high=0.5, high_open=True)


def trimmed_mean(
    vectors: Sequence[np.ndarray], beta: float, weights: Sequence[float] | None = None
) -> np.ndarray:
    """Per-coordinate mean after dropping floor(beta * n) values at each end."""
    beta = check_beta(beta)
    as_weights(weights, len(vectors))
    cut = math.floor(beta * len(vectors))

    def reduce(rows: list[np.ndarray], out: np.ndarray) -> None:
        _mean_of_rows(rows[cut : len(rows) - cut], out)

    return _coordinatewise(vectors, reduce)
