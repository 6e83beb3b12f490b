"""Fragment-wise outer sync (Streaming DiLoCo, arXiv 2501.18512): which part of the model a
round syncs, and how a member's own model takes up what the mesh synced.

Why: a DiLoCo round sends every parameter's pseudo-gradient up and the step down, so a
round's peak bandwidth is the model's size. Cut the parameter vector into F fragments and
sync one fragment a round, in turn: each round moves about 1/F of the model each way, while
members keep training the fragments not being synced on their own copy of the model.

The split depends on the model's size alone, so every node computes the same one without a
message: F contiguous ranges of the flat parameter vector (parameters in the model's own
order, so a fragment is a run of consecutive layers), as equal in size as integers allow.
Equal sizes keep every round's bytes the same, which is what bounds the peak; a split by whole
tensors cannot balance a model whose embedding holds most of its parameters. Round ``r``
(numbered from 1) syncs fragment ``(r - 1) mod F``.

Pure numpy, no state: the node persists a member's own model, and the root and every member
apply the same slice of the same step, so the committed model is rebuilt bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregation.errors import AggregationError


@dataclass(frozen=True)
class Span:
    """The part ``[start, stop)`` of a parameter vector of ``size`` values one round syncs."""

    start: int
    stop: int
    size: int

    @property
    def length(self) -> int:
        return self.stop - self.start

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == self.size


def fragment_bounds(size: int, fragments: int) -> list[Span]:
    """The ``fragments`` contiguous ranges of a vector of ``size`` values: in order, covering
    every index exactly once, lengths differing by at most one. A model smaller than the count
    gets one fragment per value (no round syncs nothing)."""
    if size < 1 or fragments < 1:
        raise AggregationError(f"cannot split {size} values into {fragments} fragments")
    count = min(fragments, size)
    cuts = [(i * size) // count for i in range(count + 1)]
    return [Span(cuts[i], cuts[i + 1], size) for i in range(count)]


def fragment_index(round_: int, fragments: int, size: int) -> int:
    """Which fragment round ``round_`` (from 1) syncs: each in turn, round-robin."""
    return (round_ - 1) % min(fragments, size)


def round_span(size: int, fragments: int, round_: int) -> Span:
    """The span round ``round_`` syncs of a model of ``size`` values (the whole at F = 1)."""
    return fragment_bounds(size, fragments)[fragment_index(round_, fragments, size)]


def synced_since(local: np.ndarray, global_: np.ndarray, fragments: int, first: int, last: int) -> np.ndarray:
    """A member's own model ``local`` with every fragment synced in rounds ``first``..``last``
    replaced by the committed model's values (Streaming DiLoCo's merge with mixing 0: a synced
    fragment starts again from the mesh's consensus); the fragments not synced keep the
    member's own training. Neither input is changed."""
    if local.shape != global_.shape:
        raise AggregationError(f"own model has shape {local.shape}, the committed one {global_.shape}")
    if last - first + 1 >= min(fragments, local.size):  # every fragment synced since
        return np.array(global_, dtype=np.float32, copy=True)
    out = np.array(local, dtype=np.float32, copy=True)
    for r in range(first, last + 1):
        span = round_span(local.size, fragments, r)
        out[span.start:span.stop] = global_[span.start:span.stop]
    return out
