"""Krum and multi-Krum (Blanchard et al. 2017).

Each update is scored by the summed squared distance to its n - f - 2
nearest neighbours; the update (or the m updates) with the lowest score
wins. We enforce the paper's condition n >= 2f + 3 (that is n > 2f + 2):
below it the neighbour count n - f - 2 is at most f, and the guarantee that
an honest update outscores every Byzantine one is lost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aggregation._checks import BLOCK, as_vectors, as_weights, blocks, check_int
from aggregation.errors import AggregationError
from aggregation.weighted import weighted_mean


def check_f(f: int) -> int:
    """f is the number of Byzantine peers tolerated."""
    return check_int(f, "f", low=0)


def _squared_distances(flat: list[np.ndarray]) -> np.ndarray:
    """All pairwise squared distances from one pass over the data.

    The Gram matrix costs one read of every vector, where explicit pairwise
    differences would read each vector n - 1 times. It is accumulated in
    float64 so that ||a||^2 + ||b||^2 - 2ab keeps ~9 significant digits of
    the distance even when updates agree to 1e-4.
    """
    n, size = len(flat), flat[0].size
    work = np.empty((n, min(size, BLOCK // 4)), dtype=np.float64)
    gram = np.zeros((n, n), dtype=np.float64)
    for sl in blocks(size, BLOCK // 4):
        part = work[:, : sl.stop - sl.start]
        for row, vec in zip(part, flat, strict=True):
            np.copyto(row, vec[sl])
        gram += part @ part.T
    sq = np.diag(gram)
    return np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0)


def _scores(
    vectors: Sequence[np.ndarray], f: int
) -> tuple[list[np.ndarray], tuple[int, ...], np.ndarray]:
    f = check_f(f)
    flat, shape = as_vectors(vectors)
    n = len(flat)
    if n < 2 * f + 3:
        raise AggregationError(
            f"Krum with f={f} needs at least {2 * f + 3} vectors (n >= 2f + 3), got {n}"
        )
    dist = _squared_distances(flat)
    neighbours = n - f - 2
    scores = np.empty(n, dtype=np.float64)
    for i in range(n):
        others = np.delete(dist[i], i)
        scores[i] = np.partition(others, neighbours - 1)[:neighbours].sum()
    return flat, shape, scores


def krum_select(
    vectors: Sequence[np.ndarray], f: int, weights: Sequence[float] | None = None
) -> int:
    """Index of the Krum winner; ties go to the lowest index, for determinism."""
    as_weights(weights, len(vectors))
    return int(np.argmin(_scores(vectors, f)[2]))


def krum(
    vectors: Sequence[np.ndarray], f: int, weights: Sequence[float] | None = None
) -> np.ndarray:
    """The Krum winner itself, as a new float32 array."""
    return np.array(vectors[krum_select(vectors, f, weights)], dtype=np.float32)


def multi_krum(
    vectors: Sequence[np.ndarray],
    f: int,
    m: int | None = None,
    weights: Sequence[float] | None = None,
) -> np.ndarray:
    """Mean of the m lowest-scoring updates (default m = n - f).

    Selection ignores ``weights``; survivors are then averaged with them
    (equal weights when None), as FedAvg over the trusted subset.
    """
    w = as_weights(weights, len(vectors))
    flat, shape, scores = _scores(vectors, f)
    m = len(flat) - f if m is None else check_int(m, "m", low=1)
    if m > len(flat):
        raise AggregationError(f"m={m} is more than the {len(flat)} vectors given")
    chosen = np.argsort(scores, kind="stable")[:m]
    return weighted_mean([flat[i] for i in chosen], w[chosen].tolist()).reshape(shape)
