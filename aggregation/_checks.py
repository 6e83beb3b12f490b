"""Argument checks and small kernels shared by every aggregation module.

Updates come from peers we do not control, so every public function validates
its inputs the same way and fails with AggregationError before touching any
state. Keeping the checks in one place keeps the messages consistent and
keeps the fast paths (one SIMD pass, no big temporaries) in one place too.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from aggregation.errors import AggregationError

#: Elements per cache block. 2**18 float32 is 1 MiB: a block of the
#: accumulator plus a block of scratch stay in L2 while whole vectors stream
#: from memory, which is what lets the reductions run near memcpy speed.
BLOCK = 1 << 18

_NUMERIC_KINDS = "fiu"


def blocks(size: int, block: int = BLOCK) -> Iterator[slice]:
    """Yield consecutive slices covering ``range(size)``."""
    for start in range(0, size, block):
        yield slice(start, min(start + block, size))


def ensure_finite(vec: np.ndarray, what: str) -> None:
    """Raise if ``vec`` holds NaN or inf.

    A float32 sum is one SIMD pass with no temporary and is NaN/inf exactly
    when an input is, unless finite values overflow the sum; only then do we
    pay for the exact element-wise test, in blocks to bound memory.
    """
    if math.isfinite(float(vec.sum(dtype=np.float32))):
        return
    for sl in blocks(vec.size):
        if not np.isfinite(vec[sl]).all():
            raise AggregationError(f"{what} contains NaN or inf")


def as_vector(vec: object, what: str = "vector", *, check_finite: bool = True) -> np.ndarray:
    """Return ``vec`` as a flat, contiguous float32 array (a view when possible)."""
    arr = np.asarray(vec)
    if arr.dtype.kind not in _NUMERIC_KINDS:
        raise AggregationError(f"{what} must be a real numeric array, got dtype {arr.dtype}")
    if arr.size == 0:
        raise AggregationError(f"{what} is empty")
    flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    if check_finite:
        ensure_finite(flat, what)
    return flat


def state_vector(state: Mapping[str, Any], key: str, size: int) -> np.ndarray:
    """A model-sized buffer a wrapper keeps in the server state (zeros before its first round),
    checked against the model's size: the state came with a model from a peer."""
    if state.get(key) is None:
        return np.zeros(size, dtype=np.float32)
    vec = as_vector(state[key], f"state[{key!r}]")
    if vec.size != size:
        raise AggregationError(f"state[{key!r}] has {vec.size} values, the model {size}")
    return vec


def as_vectors(
    vectors: Sequence[np.ndarray], *, check_finite: bool = True
) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """Validate a non-empty list of same-shape vectors.

    Returns the flat float32 views and the common shape, so that results can
    be given back in the shape the caller used. Callers that detect NaN/inf
    in their own output (cheaper: no extra pass) pass ``check_finite=False``
    and then call ``blame_non_finite``.
    """
    if isinstance(vectors, np.ndarray) and vectors.ndim < 2:
        raise AggregationError("vectors must be a sequence of arrays, not a single array")
    if len(vectors) == 0:
        raise AggregationError("vectors is empty: nothing to aggregate")
    shape = np.shape(vectors[0])
    flat: list[np.ndarray] = []
    for i, vec in enumerate(vectors):
        if np.shape(vec) != shape:
            raise AggregationError(
                f"vector {i} has shape {np.shape(vec)}, expected {shape} like vector 0"
            )
        flat.append(as_vector(vec, f"vector {i}", check_finite=check_finite))
    return flat, shape


def output_is_finite(block: np.ndarray) -> bool:
    """True when an output block holds no NaN/inf.

    NaN or inf in any input reaches every output that used it (0 * inf is
    NaN too), so checking the output block while it is still in cache
    replaces a full extra pass over every input.
    """
    return math.isfinite(float(block.sum(dtype=np.float32))) or bool(np.isfinite(block).all())


def blame_non_finite(flat: Sequence[np.ndarray], what: str) -> AggregationError:
    """Build the error for a non-finite output: name the bad input, else overflow."""
    for i, vec in enumerate(flat):
        try:
            ensure_finite(vec, f"vector {i}" if len(flat) > 1 else "vector")
        except AggregationError as exc:
            return exc
    return AggregationError(f"{what} overflowed float32 (weights or values too large)")


def as_weights(weights: Sequence[float] | None, count: int) -> np.ndarray:
    """Validate weights for ``count`` vectors; ``None`` means equal weights."""
    if weights is None:
        return np.ones(count, dtype=np.float64)
    try:
        arr = np.asarray(weights, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise AggregationError(f"weights must be numbers: {exc}") from None
    if arr.size != count:
        raise AggregationError(f"got {arr.size} weights for {count} vectors")
    check_weight_values(arr)
    return arr


def check_weight_values(arr: np.ndarray) -> None:
    """Weights are sample counts or trust levels: finite, none negative, some positive."""
    if not np.isfinite(arr).all():
        raise AggregationError("weights must be finite")
    if (arr < 0).any():
        raise AggregationError("weights must not be negative")
    if not arr.sum() > 0:
        raise AggregationError("weights must sum to more than zero")


def check_number(
    value: float,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Check a real hyper-parameter against an interval and return it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise AggregationError(f"{name} must be a number, got {value!r}")
    val = float(value)
    if not math.isfinite(val):
        raise AggregationError(f"{name} must be finite, got {value!r}")
    too_low = low is not None and (val <= low if low_open else val < low)
    too_high = high is not None and (val >= high if high_open else val > high)
    if too_low or too_high:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise AggregationError(f"{name} must be in {left}{lo}, {hi}{right}, got {value!r}")
    return val


def check_int(value: int, name: str, *, low: int) -> int:
    """Check an integer hyper-parameter is at least ``low``."""
    if isinstance(value, bool):
        raise AggregationError(f"{name} must be an integer, got {value!r}")
    try:
        val = operator.index(value)
    except TypeError:
        raise AggregationError(f"{name} must be an integer, got {value!r}") from None
    if val < low:
        raise AggregationError(f"{name} must be at least {low}, got {val}")
    return val


def squared_norm(block: np.ndarray) -> float:
    """Sum of squares of a float32 block of at most BLOCK elements.

    A float32 dot product is SIMD and, unlike a float64 BLAS ddot (which
    OpenBLAS threads pathologically on small hosts: ~7 ms per MiB measured),
    runs at memory speed; over one cache block its rounding error stays near
    1e-6. Only when the result overflowed or underflowed do we rescale the
    block by its peak, which is exact enough and rare.
    """
    part = float(np.dot(block, block))
    if math.isfinite(part) and part > 1e-30:
        return part
    peak = float(np.max(np.abs(block)))
    if peak == 0.0 or not math.isfinite(peak):
        return 0.0 if peak == 0.0 else math.inf
    scaled = block / np.float32(peak)
    return float(np.dot(scaled, scaled)) * peak * peak


def l2_norm(vec: np.ndarray) -> float:
    """L2 norm of a float32 vector, summed per cache block in Python floats."""
    return math.sqrt(sum(squared_norm(vec[sl]) for sl in blocks(vec.size)))
