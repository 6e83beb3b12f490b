"""Partitions: disjoint, covering, deterministic, and no node left without a batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.ml.partition import partition_indices


def assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_disjoint_covering_deterministic(scheme: str):
    labels = np.random.default_rng(1).integers(0, 10, size=1000)
    parts = partition_indices(labels, 4, scheme, alpha=0.5, shards_per_node=2, seed=7)
    assert_disjoint_cover(parts, len(labels))
    again = partition_indices(labels, 4, scheme, alpha=0.5, shards_per_node=2, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition_indices(labels, 4, scheme, alpha=0.5, shards_per_node=2, seed=8)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(40, 400),
    k=st.integers(1, 8),
    alpha=st.floats(0.01, 10.0),
    min_size=st.integers(1, 32),
    seed=st.integers(0, 2**16),
)
def test_dirichlet_respects_min_size(n: int, k: int, alpha: float, min_size: int, seed: int):
    labels = np.random.default_rng(seed).integers(0, 10, size=n)
    parts = partition_indices(labels, k, "dirichlet", alpha=alpha, seed=seed, min_size=min_size)
    assert_disjoint_cover(parts, n)
    assert min(len(p) for p in parts) >= min(min_size, n // k)


def test_dirichlet_is_skewed_and_shards_limit_labels():
    labels = np.repeat(np.arange(10), 100)
    skewed = partition_indices(labels, 4, "dirichlet", alpha=0.1, seed=0)
    shares = [np.bincount(labels[p], minlength=10).max() / len(p) for p in skewed]
    assert max(shares) > 0.3  # an IID split would give about 0.1
    shards = partition_indices(labels, 5, "shards", shards_per_node=2, seed=0)
    assert all(len(np.unique(labels[p])) <= 2 for p in shards)


def test_groups_keep_each_group_whole():
    groups = np.repeat(np.arange(12), np.arange(1, 13))
    parts = partition_indices(np.zeros(len(groups)), 3, "groups", groups=groups, seed=0)
    assert_disjoint_cover(parts, len(groups))
    owners = [set(groups[p]) for p in parts]
    assert all(not (a & b) for i, a in enumerate(owners) for b in owners[i + 1 :])


def test_local_gives_everyone_everything_and_errors_are_clear():
    assert all(len(p) == 5 for p in partition_indices(np.zeros(5), 3, "local"))
    with pytest.raises(ValueError, match="unknown partition scheme"):
        partition_indices(np.zeros(5), 2, "random")
    with pytest.raises(ValueError, match="one group id per sample"):
        partition_indices(np.zeros(5), 2, "groups")
    with pytest.raises(ValueError, match="cannot split 3 samples into 4"):
        partition_indices(np.zeros(3), 4, "iid")
