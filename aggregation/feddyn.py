"""FedDyn's server side: the mesh's running sum of averaged deltas as server-optimizer state.

FedDyn (Acar et al. 2021) keeps ``h = -alpha * Σ_t mean_t(Δ)`` at the server and sets the
model to the members' mean less ``h / alpha``: the new model is the old one plus the round's
averaged delta plus the sum of every averaged delta so far (this round's included). The sum is
kept here as :data:`SUM_KEY` in the state that travels with the model, so ``alpha`` never
divides anything and a member that replays the step rebuilds it bit for bit. The step is a
function of the averaged delta alone, so a tree of group means gives the flat result; the
members' half of the method is in ``gpuflex.ml.drift``. Every member of the round counts
(the paper's ``m`` is the round's contributors: a mesh has no fixed roster).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregation._checks import as_vector, state_vector
from aggregation.errors import AggregationError
from aggregation.server_opt import ServerOptimizer, State

#: Where the running sum of averaged deltas lives in the server state.
SUM_KEY = "feddyn_sum"


@dataclass(frozen=True)
class FedDyn:
    """Wraps the job's server optimizer (plain FedAvg in the paper): the inner step gets the
    averaged delta plus the running sum."""

    inner: ServerOptimizer

    @property
    def name(self) -> str:
        return f"feddyn+{self.inner.name}"

    def step(self, params: np.ndarray, delta: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        p = as_vector(params, "params")
        d = as_vector(delta, "delta")
        if d.size != p.size:
            raise AggregationError(f"delta has {d.size} values, params have {p.size}")
        total = (state_vector(state, SUM_KEY, p.size) + d).astype(np.float32)
        inner_state = {k: v for k, v in state.items() if k != SUM_KEY}
        new_params, new_state = self.inner.step(params, (d + total).reshape(np.shape(params)), inner_state)
        return new_params, {**new_state, SUM_KEY: total}
