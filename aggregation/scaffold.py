"""SCAFFOLD's server side: the mesh's control variate ``c`` as server-optimizer state.

A member's update is ``[Δy, Δc_i]`` in one vector (see ``gpuflex.ml.drift``), so the tree,
codecs and robust rules average both halves with the same weights. The root applies the
job's own optimizer to the ``Δy`` half and adds the ``Δc`` half's mean to ``c`` (Karimireddy et
al. 2020, with every member of the round counted: ``|S|/N = 1`` over the members that
contributed). ``c`` is kept under :data:`CONTROL_KEY` in the state the node ships with the
model, so the next round's members read it where they read momentum buffers today, and a
member that replays the step rebuilds it bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregation._checks import as_vector, state_vector
from aggregation.errors import AggregationError
from aggregation.server_opt import ServerOptimizer, State

#: Where ``c`` lives in the server state.
CONTROL_KEY = "scaffold_c"


@dataclass(frozen=True)
class Scaffold:
    """Wraps the job's server optimizer: ``step`` takes a delta twice the model's length."""

    inner: ServerOptimizer

    @property
    def name(self) -> str:
        return f"scaffold+{self.inner.name}"

    def step(self, params: np.ndarray, delta: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        p = as_vector(params, "params")
        d = as_vector(delta, "delta")
        if d.size != 2 * p.size:
            raise AggregationError(f"a SCAFFOLD update has {2 * p.size} values (model and control), got {d.size}")
        control = state_vector(state, CONTROL_KEY, p.size)
        inner_state = {k: v for k, v in state.items() if k != CONTROL_KEY}
        new_params, new_state = self.inner.step(params, d[: p.size].reshape(np.shape(params)), inner_state)
        return new_params, {**new_state, CONTROL_KEY: (control + d[p.size:]).astype(np.float32)}


def control_of(state: State, size: int) -> np.ndarray | None:
    """The mesh's ``c`` in a model's state, checked against the model's size; None before
    the first SCAFFOLD round."""
    control = state.get(CONTROL_KEY)
    if control is None:
        return None
    vec = np.asarray(control, dtype=np.float32).reshape(-1)
    if vec.size != size:
        raise AggregationError(f"state['scaffold_c'] has {vec.size} values, the model {size}")
    return vec
