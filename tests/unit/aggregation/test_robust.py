"""Byzantine-robust rules on hand-computed cases, plus shapes and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation import (
    AggregationError,
    centered_clipping,
    coordinate_median,
    krum,
    krum_select,
    make_rule,
    multi_krum,
    norm_bound,
    trimmed_mean,
)
from aggregation._sortnet import network, sort_rows


def _scalars(*values: float) -> list[np.ndarray]:
    return [np.array([v], np.float32) for v in values]


def test_median_hand_computed() -> None:
    assert coordinate_median(_scalars(1, 2, 100)).tolist() == [2.0]
    assert coordinate_median(_scalars(1, 2, 100, 3)).tolist() == [2.5]
    assert coordinate_median(_scalars(7)).tolist() == [7.0]


def test_median_is_per_coordinate_and_keeps_shape() -> None:
    vecs = [np.array([[1, 50], [3, 0]]), np.array([[2, 40], [1, 0]]), np.array([[9, 60], [2, 0]])]
    out = coordinate_median(vecs)
    assert out.shape == (2, 2) and out.dtype == np.float32
    assert out.tolist() == [[2, 50], [2, 0]]


def test_trimmed_mean_drops_extremes() -> None:
    # n = 5, beta = 0.2 -> drop one at each end: mean(2, 3, 4) = 3
    assert trimmed_mean(_scalars(-1000, 2, 3, 4, 1000), 0.2).tolist() == [3.0]
    # beta = 0.1 -> floor(0.5) = 0 dropped: plain mean
    assert trimmed_mean(_scalars(1, 2, 3, 4, 5), 0.1).tolist() == [3.0]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 20), size=st.integers(1, 30), seed=st.integers(0, 2**32 - 1))
def test_coordinate_rules_match_numpy(n: int, size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    stack = rng.standard_normal((n, size)).astype(np.float32)
    vecs = list(stack)
    np.testing.assert_allclose(coordinate_median(vecs), np.median(stack, axis=0), atol=1e-6)
    cut = int(0.3 * n)
    expected = np.sort(stack, axis=0)[cut : n - cut].mean(axis=0)
    np.testing.assert_allclose(trimmed_mean(vecs, 0.3), expected, atol=1e-5)


@pytest.mark.parametrize("n", range(1, 34))
def test_sorting_network_sorts(n: int) -> None:
    rng = np.random.default_rng(n)
    stack = rng.integers(-3, 4, (n, 64)).astype(np.float32)  # many ties
    rows = sort_rows([r.copy() for r in stack], np.empty(64, np.float32))
    np.testing.assert_array_equal(np.array(rows), np.sort(stack, axis=0))
    assert all(a < b < n for a, b in network(n))


def test_krum_hand_computed() -> None:
    # n = 5, f = 1: each score sums the n - f - 2 = 2 nearest squared distances.
    # 0.2: .16+.25=.41  0.7: .01+.01=.02  1.0: .04+.09=.13  0.6: .01+.04  0.8: .01+.04
    vecs = _scalars(0.2, 0.7, 1.0, 0.6, 0.8)
    assert krum_select(vecs, 1) == 1
    assert krum(vecs, 1).tolist() == pytest.approx([0.7])


def test_krum_enforces_n_at_least_2f_plus_3() -> None:
    with pytest.raises(AggregationError, match=r"at least 5 vectors \(n >= 2f \+ 3\)"):
        krum_select(_scalars(0.2, 0.7, 1.0), 1)
    assert krum_select(_scalars(0.2, 0.7, 1.1), 0) == 1  # f = 0: 1 neighbour each


def test_krum_ignores_a_far_outlier_in_many_dimensions() -> None:
    rng = np.random.default_rng(1)
    honest = [rng.normal(0, 0.1, (4, 5)).astype(np.float32) for _ in range(6)]
    vecs = [*honest, np.full((4, 5), 1e6, np.float32)]
    assert krum_select(vecs, 2) < 6
    assert krum(vecs, 2).shape == (4, 5)


def test_multi_krum() -> None:
    vecs = _scalars(0.2, 0.7, 1.0, 0.6, 0.8)
    # m = 3 lowest scores: 0.7 (.02), 0.6 (.05), 0.8 (.05) -> mean 0.7
    assert multi_krum(vecs, 1, m=3).tolist() == pytest.approx([0.7])
    # default m = n - f = 4 adds 1.0 (.13): mean(0.7, 0.6, 0.8, 1.0) = 0.775
    assert multi_krum(vecs, 1).tolist() == pytest.approx([0.775])
    # weights never help selection (0.2 claims 100) but average the survivors:
    # (0.7 + 3 * 0.6 + 0.8) / 5
    w = [100, 1, 1, 3, 1]
    assert multi_krum(vecs, 1, m=3, weights=w).tolist() == pytest.approx([0.66])
    with pytest.raises(AggregationError, match="m=6"):
        multi_krum(vecs, 1, m=6)


def test_centered_clipping_limits_an_attacker() -> None:
    honest = [np.array([1.0, 1.0]), np.array([1.2, 0.8]), np.array([0.8, 1.2])]
    vecs = [*honest, np.array([1e6, -1e6])]
    out = centered_clipping(vecs, tau=1.0, iterations=3, center=np.zeros(2))
    # each iteration moves by at most tau and the attacker's pull is tau / n
    assert np.linalg.norm(out - np.array([1.0, 1.0])) < 1.0
    assert out.dtype == np.float32


def test_centered_clipping_large_tau_is_mean_and_default_center() -> None:
    vecs = _scalars(1.0, 2.0, 6.0)
    out = centered_clipping(vecs, tau=1e9, iterations=1, center=np.zeros(1))
    assert out.tolist() == pytest.approx([3.0])
    # default center is the median (2); one step with tau 0.5 from there:
    # diffs -1, 0, 4 clip to -0.5, 0, 0.5 -> mean 0 -> stays at 2
    assert centered_clipping(vecs, tau=0.5, iterations=2).tolist() == pytest.approx([2.0])


def test_norm_bound_clip_and_reject() -> None:
    vecs = [np.array([3.0, 4.0]), np.array([0.0, 5.0]), np.array([0.0, 100.0])]
    kept, rejected = norm_bound(vecs, factor=2.0, mode="clip")
    assert rejected == [] and len(kept) == 3
    np.testing.assert_allclose(kept[2], [0.0, 10.0])  # clipped to 2 * median (5)
    np.testing.assert_allclose(kept[0], [3.0, 4.0])
    kept, rejected = norm_bound(vecs, factor=2.0, mode="reject")
    assert rejected == [2] and len(kept) == 2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: coordinate_median([]), "empty"),
        (lambda: coordinate_median([np.ones(2), np.ones(3)]), "shape"),
        (lambda: coordinate_median([np.ones(1), np.array([np.nan])]), "NaN"),
        (lambda: trimmed_mean(_scalars(1, 2), 0.5), "beta"),
        (lambda: trimmed_mean(_scalars(1, 2), -0.1), "beta"),
        (lambda: krum(_scalars(1, 2, 3), -1), "f"),
        (lambda: multi_krum(_scalars(1, 2, 3), 0, m=0), "m"),
        (lambda: centered_clipping(_scalars(1, 2), tau=0), "tau"),
        (lambda: centered_clipping(_scalars(1, 2), tau=1, iterations=0), "iterations"),
        (lambda: centered_clipping(_scalars(1, 2), 1, center=np.ones(2)), "center"),
        (lambda: norm_bound(_scalars(1, 2), factor=0), "factor"),
        (lambda: norm_bound(_scalars(1, 2), mode="drop"), "mode"),  # type: ignore[arg-type]
        (lambda: coordinate_median(_scalars(1, 2), weights=[1]), "weights"),
    ],
)
def test_bad_arguments(call: object, match: str) -> None:
    with pytest.raises(AggregationError, match=match):
        call()  # type: ignore[operator]


def test_make_rule() -> None:
    vecs = _scalars(0.2, 0.7, 1.0, 0.6, 0.8)
    assert make_rule("mean")(vecs, None).tolist() == pytest.approx([0.66])
    assert make_rule("mean")(_scalars(1, 3), [3, 1]).tolist() == pytest.approx([1.5])
    assert make_rule("median")(vecs, None).tolist() == pytest.approx([0.7])
    assert make_rule("trimmed-mean", beta=0.2)(vecs, None).tolist() == pytest.approx([0.7])
    assert make_rule("krum", f=1)(vecs, [1] * 5).tolist() == pytest.approx([0.7])
    assert make_rule("multi-krum", f=1, m=3)(vecs, None).tolist() == pytest.approx([0.7])
    assert make_rule("centered-clipping", tau=10.0)(vecs, None).shape == (1,)


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("avg", {}, "valid names: mean, median, trimmed-mean, krum"),
        ("trimmed-mean", {}, "accepted: beta"),
        ("trimmed-mean", {"beta": 0.7}, "beta"),
        ("krum", {"f": 1, "m": 2}, "accepted: f"),
        ("median", {"beta": 0.1}, "accepted: none"),
        ("centered-clipping", {"tau": -1}, "tau"),
    ],
)
def test_make_rule_errors(name: str, params: dict[str, float], match: str) -> None:
    with pytest.raises(AggregationError, match=match):
        make_rule(name, **params)
