"""FedDyn's server side: the inner optimizer gets the round's mean delta plus the running sum of
every mean delta so far, and a tree of weighted group means gives the flat model and state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation.errors import AggregationError
from aggregation.feddyn import SUM_KEY, FedDyn
from aggregation.server_opt import make_server_optimizer
from aggregation.weighted import WeightedAccumulator


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 300), rounds=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       strategy=st.sampled_from(["fedavg", "fedavgm", "diloco"]))
def test_the_inner_optimizer_steps_on_the_mean_delta_plus_the_running_sum(
        size: int, rounds: int, seed: int, strategy: str) -> None:
    rng = np.random.default_rng(seed)
    inner = make_server_optimizer(strategy)
    wrapped = FedDyn(inner)
    params = plain = rng.normal(size=size).astype(np.float32)
    state: dict[str, np.ndarray] = {}
    plain_state: dict[str, np.ndarray] = {}
    running = np.zeros(size, np.float32)
    for _ in range(rounds):
        d = rng.normal(scale=0.1, size=size).astype(np.float32)
        running = running + d
        params, state = wrapped.step(params, d, state)
        plain, plain_state = inner.step(plain, d + running, plain_state)
        np.testing.assert_allclose(params, plain, rtol=1e-5, atol=1e-6)
        assert set(state) == set(plain_state) | {SUM_KEY}
        np.testing.assert_allclose(state[SUM_KEY], running, rtol=1e-5, atol=1e-6)


def test_with_plain_fedavg_it_is_the_papers_server_model() -> None:
    """theta_t = mean of the members' models - h_t / alpha, with h_t = h_{t-1} - alpha * mean delta."""
    alpha, rng = 0.05, np.random.default_rng(3)
    params = theta = rng.normal(size=7).astype(np.float64)
    h = np.zeros(7)
    state: dict[str, np.ndarray] = {}
    wrapped = FedDyn(make_server_optimizer("fedavg"))
    for _ in range(3):
        members = [theta + rng.normal(scale=0.1, size=7) for _ in range(4)]
        mean_delta = np.mean(members, axis=0) - theta
        h = h - alpha * mean_delta
        theta = np.mean(members, axis=0) - h / alpha
        params, state = wrapped.step(params.astype(np.float32), mean_delta.astype(np.float32), state)
        params = params.astype(np.float64)
        np.testing.assert_allclose(params, theta, rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 64), groups=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       rounds=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_a_tree_of_group_means_steps_to_the_flat_model_and_state(
        size: int, groups: list[int], rounds: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    wrapped = FedDyn(make_server_optimizer("fedavgm"))
    tree_params = flat_params = rng.normal(size=size).astype(np.float32)
    tree_state: dict[str, np.ndarray] = {}
    flat_state: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        flat, top = WeightedAccumulator(), WeightedAccumulator()
        for count in groups:
            group = WeightedAccumulator()
            for _ in range(count):
                update = rng.normal(scale=0.1, size=size).astype(np.float32)
                weight = float(rng.integers(1, 100))
                flat.add(update, weight)
                group.add(update, weight)
            top.add(group.result(), group.total_weight)
        tree_params, tree_state = wrapped.step(tree_params, top.result(), tree_state)
        flat_params, flat_state = wrapped.step(flat_params, flat.result(), flat_state)
        np.testing.assert_allclose(tree_params, flat_params, rtol=1e-4, atol=1e-5)
        for key in flat_state:
            np.testing.assert_allclose(tree_state[key], flat_state[key], rtol=1e-4, atol=1e-5)


def test_a_delta_or_a_sum_of_another_model_is_refused() -> None:
    wrapped = FedDyn(make_server_optimizer("fedavg"))
    params = np.zeros(5, np.float32)
    with pytest.raises(AggregationError, match="delta has 4"):
        wrapped.step(params, np.zeros(4, np.float32), {})
    with pytest.raises(AggregationError, match="feddyn_sum"):
        wrapped.step(params, np.zeros(5, np.float32), {SUM_KEY: np.zeros(4, np.float32)})
    assert wrapped.name == "feddyn+fedavg"
