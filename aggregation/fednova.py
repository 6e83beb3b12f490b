"""FedNova: averaging updates from members that took different numbers of local steps.

With a time budget a fast member takes many local steps and a slow one few. Plain FedAvg then
weights each member's *objective* by how far it walked, not by its share of the data, and the
federation converges to the wrong point (objective inconsistency). FedNova (Wang et al. 2020,
"Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization")
divides each member's change by its local work first and scales the mean back up once:

    Δ = τ_eff · Σ_i p_i · Δ_i / a_i,      τ_eff = Σ_i p_i · a_i,      p_i = n_i / Σ_j n_j

``Δ_i`` is member i's change (new local model − base), ``n_i`` its sample weight and ``a_i`` the L1 norm
of its local aggregation vector: ``τ_i`` steps of plain SGD, or
``(τ − ρ(1 − ρ^τ)/(1 − ρ)) / (1 − ρ)`` for SGD with momentum ρ (the paper's Section 4).

The paper takes ``n_i`` as the data member i holds. The node passes the samples it saw in the
round instead (steps × batch): a member that took three steps in a time budget, beside
members that took thirty, gives a direction measured over three batches, and weighed by its
data it pulled each round's step back by its data share (a quarter of the mesh's progress
for one slow member of four). Weighed by work, the slow member adds what it did and the mesh
keeps its pace; members' objectives then count in proportion to their compute, which for
data spread alike (the usual volunteer case) is the same objective.

Both sums are sample-weighted means, so they compose through a group tree exactly: a leader
folds the normalised vectors ``Δ_i / a_i`` with weight ``n_i`` into an ordinary weighted mean,
and the root multiplies by ``τ_eff``, which it recomputes from the members' signed step counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from aggregation._checks import as_vector, check_number
from aggregation.errors import AggregationError
from aggregation.tree import ParentMap
from aggregation.weighted import WeightedAccumulator, weighted_mean

#: Local step counts above this are refused: no round of any real job takes that many.
MAX_STEPS = 10_000_000


def step_norm(steps: float, momentum: float = 0.0) -> float:
    """``a_i``: how much a member's local optimizer moved per unit of gradient over ``steps``.

    Plain SGD: the step count. SGD with heavy-ball momentum ρ: each gradient keeps acting on
    later steps, ``Σ_{k=1..τ} (1 − ρ^k)/(1 − ρ)`` in total, which is the closed form above.
    """
    tau = check_number(steps, "steps", low=1.0, high=float(MAX_STEPS))
    rho = check_number(momentum, "momentum", low=0.0, high=1.0, high_open=True)
    if rho == 0.0:
        return tau
    return (tau - rho * (1.0 - rho**tau) / (1.0 - rho)) / (1.0 - rho)


def effective_norm(samples: Sequence[float], norms: Sequence[float]) -> float:
    """``τ_eff = Σ p_i a_i``: the sample-weighted mean of the members' step norms."""
    if len(samples) != len(norms) or not samples:
        raise AggregationError(f"need one norm per sample weight, got {len(norms)} and {len(samples)}")
    w = [check_number(n, "samples", low=0.0) for n in samples]
    a = [check_number(x, "norm", low=0.0, low_open=True) for x in norms]
    total = math.fsum(w)
    if not total > 0:
        raise AggregationError("all sample weights are zero: the mean is undefined")
    return math.fsum(wi * ai for wi, ai in zip(w, a, strict=True)) / total


def normalise(delta: np.ndarray, norm: float) -> np.ndarray:
    """``Δ_i / a_i`` as float32: what a leader folds for one member."""
    a = check_number(norm, "norm", low=0.0, low_open=True)
    return (as_vector(delta, "delta") / np.float32(a)).reshape(np.shape(delta))


def fednova_mean(deltas: Sequence[np.ndarray], samples: Sequence[float],
                 norms: Sequence[float]) -> np.ndarray:
    """The FedNova update of a flat set of members (the formula in the module docstring)."""
    if not (len(deltas) == len(samples) == len(norms)):
        raise AggregationError("need one sample weight and one norm per delta")
    direction = weighted_mean([normalise(d, a) for d, a in zip(deltas, norms, strict=True)], samples)
    return (direction * np.float32(effective_norm(samples, norms))).astype(np.float32)


def hierarchical_fednova(tree: ParentMap, deltas: Mapping[str, np.ndarray], samples: Mapping[str, float],
                         norms: Mapping[str, float]) -> np.ndarray:
    """The same update computed up ``tree`` as the node does it: every leader streams the
    normalised vectors of its group (and its children's partial means, weighted by the
    samples they cover) into one weighted mean; the root scales by ``τ_eff``. Members absent
    from ``deltas`` relay their children's partials without contributing."""
    if not deltas:
        raise AggregationError("no member contributed: nothing to aggregate")
    if set(deltas) - set(tree):
        raise AggregationError(f"deltas from non-members: {sorted(set(deltas) - set(tree))}")
    kids: dict[str, list[str]] = {m: [] for m in tree}
    root = None
    for member, parent in tree.items():
        if parent is None:
            root = member
        else:
            kids[parent].append(member)
    assert root is not None

    def fold(node: str) -> tuple[np.ndarray | None, float]:
        acc = WeightedAccumulator()
        if node in deltas:
            acc.add(normalise(deltas[node], norms[node]), samples[node])
        for child in kids[node]:
            vec, weight = fold(child)
            if vec is not None:
                acc.add(vec, weight)
        return (acc.result(), acc.total_weight) if acc.count else (None, 0.0)

    direction, _ = fold(root)
    assert direction is not None
    present = sorted(deltas)
    tau = effective_norm([samples[m] for m in present], [norms[m] for m in present])
    return (direction * np.float32(tau)).astype(np.float32)
