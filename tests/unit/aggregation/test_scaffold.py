"""SCAFFOLD's server side: the model half goes through the job's optimizer, the control half
accumulates into ``c``, and a tree of weighted means gives the flat result for both halves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation.errors import AggregationError
from aggregation.scaffold import CONTROL_KEY, Scaffold, control_of
from aggregation.server_opt import make_server_optimizer
from aggregation.weighted import WeightedAccumulator


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 300), rounds=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       strategy=st.sampled_from(["fedavg", "fedavgm", "fedadam", "diloco"]))
def test_the_model_half_steps_like_the_inner_optimizer_and_c_sums_the_control_half(
        size: int, rounds: int, seed: int, strategy: str) -> None:
    rng = np.random.default_rng(seed)
    inner = make_server_optimizer(strategy)
    wrapped = Scaffold(inner)
    params = plain = rng.normal(size=size).astype(np.float32)
    state: dict[str, np.ndarray] = {}
    plain_state: dict[str, np.ndarray] = {}
    control_sum = np.zeros(size, np.float32)
    for _ in range(rounds):
        dy = rng.normal(scale=0.1, size=size).astype(np.float32)
        dc = rng.normal(scale=0.1, size=size).astype(np.float32)
        params, state = wrapped.step(params, np.concatenate([dy, dc]), state)
        plain, plain_state = inner.step(plain, dy, plain_state)
        control_sum = control_sum + dc
        np.testing.assert_array_equal(params, plain)
        assert set(state) == set(plain_state) | {CONTROL_KEY}
        np.testing.assert_allclose(state[CONTROL_KEY], control_sum, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(control_of(state, size), state[CONTROL_KEY])


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 64), groups=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       seed=st.integers(0, 2**32 - 1))
def test_a_tree_of_group_means_gives_the_flat_mean_of_both_halves(size: int, groups: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    flat, top = WeightedAccumulator(), WeightedAccumulator()
    for count in groups:
        group = WeightedAccumulator()
        for _ in range(count):
            update = rng.normal(size=2 * size).astype(np.float32)
            weight = float(rng.integers(1, 100))
            flat.add(update, weight)
            group.add(update, weight)
        top.add(group.result(), group.total_weight)
    np.testing.assert_allclose(top.result(), flat.result(), rtol=1e-4, atol=1e-5)


def test_a_step_of_the_wrong_length_or_a_foreign_c_is_refused() -> None:
    wrapped = Scaffold(make_server_optimizer("fedavg"))
    params = np.zeros(5, np.float32)
    with pytest.raises(AggregationError, match="model and control"):
        wrapped.step(params, np.zeros(5, np.float32), {})
    with pytest.raises(AggregationError, match="scaffold_c"):
        wrapped.step(params, np.zeros(10, np.float32), {CONTROL_KEY: np.zeros(4, np.float32)})
    with pytest.raises(AggregationError, match="scaffold_c"):
        control_of({CONTROL_KEY: np.zeros(3, np.float32)}, 5)
    assert control_of({}, 5) is None
