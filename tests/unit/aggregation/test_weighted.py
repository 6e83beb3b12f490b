"""Weighted mean and the streaming accumulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation import AggregationError, WeightedAccumulator, weighted_mean


def test_hand_computed_mean() -> None:
    vecs = [np.array([1.0, 2.0], np.float32), np.array([4.0, 8.0], np.float32)]
    np.testing.assert_allclose(weighted_mean(vecs, [1, 3]), [3.25, 6.5])


def test_weights_are_normalised_and_zero_weight_ignored() -> None:
    vecs = [np.array([1.0]), np.array([3.0]), np.array([99.0])]
    assert weighted_mean(vecs, [10, 10, 0])[0] == pytest.approx(2.0)


def test_result_is_float32_in_input_shape() -> None:
    vecs = [np.ones((2, 3), np.float64), np.zeros((2, 3), np.float64)]
    out = weighted_mean(vecs, [1, 1])
    assert out.dtype == np.float32 and out.shape == (2, 3)


def test_spans_several_cache_blocks() -> None:
    rng = np.random.default_rng(0)
    vecs = [rng.standard_normal(600_001).astype(np.float32) for _ in range(3)]
    w = [1.0, 2.0, 5.0]
    expected = np.average(np.array(vecs, np.float64), axis=0, weights=w)
    np.testing.assert_allclose(weighted_mean(vecs, w), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("vectors", "weights", "match"),
    [
        ([], [], "empty"),
        ([np.ones(2)], [1, 2], "2 weights for 1"),
        ([np.ones(2), np.ones(3)], [1, 1], "shape"),
        ([np.ones(2), np.ones(2)], [1, -1], "negative"),
        ([np.ones(2), np.ones(2)], [0, 0], "more than zero"),
        ([np.ones(2), np.ones(2)], [1, float("nan")], "finite"),
        ([np.ones(2), np.array([1.0, np.nan])], [1, 1], "vector 1 contains NaN"),
        ([np.ones(2), np.array([np.inf, 1.0])], [1, 1], "NaN or inf"),
        ([np.zeros(0)], [1], "empty"),
        ([np.array(["a"])], [1], "numeric"),
    ],
)
def test_bad_arguments(vectors: list[np.ndarray], weights: list[float], match: str) -> None:
    with pytest.raises(AggregationError, match=match):
        weighted_mean(vectors, weights)


def test_aggregation_error_is_value_error() -> None:
    with pytest.raises(ValueError):
        weighted_mean([], [])


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 10),
    size=st.integers(1, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_accumulator_matches_batch(n: int, size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    vecs = [rng.standard_normal(size).astype(np.float32) * 10 for _ in range(n)]
    weights = rng.uniform(0.01, 100, n).tolist()
    acc = WeightedAccumulator(size)
    for v, w in zip(vecs, weights, strict=True):
        acc.add(v, w)
    assert acc.count == n
    assert acc.total_weight == pytest.approx(sum(weights))
    np.testing.assert_allclose(acc.result(), weighted_mean(vecs, weights), rtol=0, atol=1e-5)


def test_accumulator_rejects_bad_update_and_keeps_state() -> None:
    acc = WeightedAccumulator()
    acc.add(np.array([1.0, 1.0]), 1.0)
    with pytest.raises(AggregationError, match="NaN"):
        acc.add(np.array([np.nan, 1.0]), 1.0)
    with pytest.raises(AggregationError, match="shape"):
        acc.add(np.array([1.0, 1.0, 1.0]), 1.0)
    with pytest.raises(AggregationError, match="weight"):
        acc.add(np.array([1.0, 1.0]), -1.0)
    acc.add(np.array([3.0, 5.0]), 3.0)
    assert acc.count == 2
    np.testing.assert_allclose(acc.result(), [2.5, 4.0])


def test_accumulator_errors() -> None:
    with pytest.raises(AggregationError, match="nothing"):
        WeightedAccumulator().result()
    with pytest.raises(AggregationError, match="size"):
        WeightedAccumulator(0)
    with pytest.raises(AggregationError, match="expected 3"):
        WeightedAccumulator(3).add(np.ones(2), 1.0)
    acc = WeightedAccumulator()
    acc.add(np.ones(2), 0.0)
    with pytest.raises(AggregationError, match="zero"):
        acc.result()


def test_accumulator_does_not_alias_inputs() -> None:
    v = np.array([1.0, 2.0], np.float32)
    acc = WeightedAccumulator()
    acc.add(v, 1.0)
    acc.add(np.array([3.0, 4.0], np.float32), 1.0)
    out = acc.result()
    assert v.tolist() == [1.0, 2.0]
    out[0] = 100
    np.testing.assert_allclose(acc.result(), [2.0, 3.0])


def test_overflow_is_reported() -> None:
    acc = WeightedAccumulator()
    with np.errstate(over="ignore"):
        acc.add(np.array([3e38], np.float32), 1e10)
    with pytest.raises(AggregationError, match="overflow"):
        acc.result()
