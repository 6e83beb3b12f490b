"""Norm-based defences: centered clipping and norm bounding.

Both limit how far any single update can move the aggregate, which is what
stops a peer that scales its update by 1e6; unlike the coordinate-wise rules
they keep the direction of honest updates intact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from aggregation._checks import (
    BLOCK,
    as_vector,
    as_vectors,
    as_weights,
    blocks,
    check_int,
    check_number,
    l2_norm,
    squared_norm,
)
from aggregation.coordinate import coordinate_median
from aggregation.errors import AggregationError


def check_tau(tau: float) -> float:
    """tau is the clipping radius; zero would freeze the center forever."""
    return check_number(tau, "tau", low=0.0, low_open=True)


def centered_clipping(
    vectors: Sequence[np.ndarray],
    tau: float,
    iterations: int = 3,
    center: np.ndarray | None = None,
    weights: Sequence[float] | None = None,
) -> np.ndarray:
    """Centered clipping of Karimireddy et al. 2021, "Learning from History".

    v <- v + mean_i((x_i - v) * min(1, tau / ||x_i - v||)), repeated. The
    paper centers on the previous round's aggregate (pass it as ``center``);
    without one we start from the coordinate median, which a minority of
    Byzantine peers cannot drag far. Each peer counts once (``weights`` is
    checked but unused). Every iteration makes two blocked passes: one for
    the n distances, one to move the center.
    """
    tau = check_tau(tau)
    iterations = check_int(iterations, "iterations", low=1)
    as_weights(weights, len(vectors))
    flat, shape = as_vectors(vectors)
    if center is None:
        v = coordinate_median(vectors).reshape(-1)
    else:
        if np.shape(center) != shape:
            raise AggregationError(f"center has shape {np.shape(center)}, vectors have {shape}")
        v = as_vector(center, "center").copy()
    scratch = np.empty(min(v.size, BLOCK), dtype=np.float32)
    step = np.empty_like(scratch)
    for _ in range(iterations):
        sq = np.zeros(len(flat), dtype=np.float64)
        for sl in blocks(v.size):
            diff = scratch[: sl.stop - sl.start]
            for i, x in enumerate(flat):
                np.subtract(x[sl], v[sl], out=diff)
                sq[i] += squared_norm(diff)
        norms = np.sqrt(sq)
        scales = tau / np.maximum(norms, tau)  # min(1, tau / norm), no 0-division
        scales /= len(flat)
        for sl in blocks(v.size):
            diff = scratch[: sl.stop - sl.start]
            move = step[: sl.stop - sl.start]
            move.fill(0.0)
            for x, scale in zip(flat, scales, strict=True):
                np.subtract(x[sl], v[sl], out=diff)
                np.multiply(diff, np.float32(scale), out=diff)
                np.add(move, diff, out=move)
            np.add(v[sl], move, out=v[sl])
    return v.reshape(shape)


def norm_bound(
    vectors: Sequence[np.ndarray],
    factor: float = 3.0,
    mode: Literal["clip", "reject"] = "clip",
) -> tuple[list[np.ndarray], list[int]]:
    """Bound every update's L2 norm to ``factor`` times the median norm.

    The median norm adapts the bound to the current phase of training (norms
    shrink as the model converges) while a minority cannot inflate it.
    Returns (kept vectors, rejected indices); in "clip" mode nothing is
    rejected and over-long vectors come back scaled onto the bound. Vectors
    within the bound come back as float32 views of the inputs, not copies.
    """
    factor = check_number(factor, "factor", low=0.0, low_open=True)
    if mode not in ("clip", "reject"):
        raise AggregationError(f"mode must be 'clip' or 'reject', got {mode!r}")
    flat, shape = as_vectors(vectors)
    norms = np.array([l2_norm(x) for x in flat])
    bound = factor * float(np.median(norms))
    kept: list[np.ndarray] = []
    rejected: list[int] = []
    for i, (x, norm) in enumerate(zip(flat, norms, strict=True)):
        if norm <= bound:
            kept.append(x.reshape(shape))
        elif mode == "reject":
            rejected.append(i)
        else:
            kept.append((x * np.float32(bound / norm)).reshape(shape))
    return kept, rejected
