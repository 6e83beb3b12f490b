"""Clipping exactness and noise scale."""

from __future__ import annotations

import numpy as np
import pytest

from aggregation import AggregationError, add_gaussian_noise, clip_to_norm


def test_clip_long_vector_exactly() -> None:
    clipped, scale = clip_to_norm(np.array([3.0, 4.0]), 1.0)
    assert scale == pytest.approx(0.2)
    np.testing.assert_allclose(clipped, [0.6, 0.8], rtol=1e-6)
    assert np.linalg.norm(clipped) == pytest.approx(1.0, rel=1e-6)


def test_short_vector_untouched_and_not_aliased() -> None:
    vec = np.array([[0.1, 0.2]], np.float32)
    clipped, scale = clip_to_norm(vec, 5.0)
    assert scale == 1.0 and clipped.shape == (1, 2)
    np.testing.assert_array_equal(clipped, vec)
    clipped[0, 0] = 9
    assert vec[0, 0] == np.float32(0.1)


def test_zero_vector() -> None:
    clipped, scale = clip_to_norm(np.zeros(3), 1.0)
    assert scale == 1.0 and not clipped.any()


def test_noise_std_matches() -> None:
    rng = np.random.default_rng(1234)
    noisy = add_gaussian_noise(np.full(200_000, 2.0, np.float32), 1.5, 0.4, rng)
    # std 0.6: the sample std of 2e5 draws is within ~0.3% (5 sigma: 0.8%)
    assert noisy.dtype == np.float32
    assert noisy.std() == pytest.approx(0.6, rel=0.01)
    assert noisy.mean() == pytest.approx(2.0, abs=5 * 0.6 / np.sqrt(200_000))


def test_zero_noise_and_reproducibility() -> None:
    vec = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(add_gaussian_noise(vec, 0.0, 1.0, np.random.default_rng(0)), vec)
    a = add_gaussian_noise(vec, 1.0, 1.0, np.random.default_rng(7))
    b = add_gaussian_noise(vec, 1.0, 1.0, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: clip_to_norm(np.ones(2), 0.0), "max_norm"),
        (lambda: clip_to_norm(np.array([np.nan]), 1.0), "NaN"),
        (lambda: add_gaussian_noise(np.ones(2), -1.0, 1.0, np.random.default_rng()), "noise"),
        (lambda: add_gaussian_noise(np.ones(2), 1.0, 1.0, np.random), "Generator"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments(call: object, match: str) -> None:
    with pytest.raises(AggregationError, match=match):
        call()  # type: ignore[operator]
