"""The group tree: shape rules and the hierarchical == flat invariant."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation import (
    AggregationError,
    build_tree,
    children,
    depth,
    hierarchical_mean,
    leaders,
    weighted_mean,
)


def _members(n: int) -> list[str]:
    return [f"peer-{i:03d}" for i in range(n)]


def test_small_tree_by_hand() -> None:
    tree = build_tree(["a", "b", "c", "d", "e", "f"], 3, root="e")
    # level 0: [a b c] led by a, [d e f] led by the root e; level 1: [a e] led by e.
    assert tree == {"a": "e", "b": "a", "c": "a", "d": "e", "e": None, "f": "e"}
    assert children(tree, "a") == ["b", "c"]
    assert children(tree, "e") == ["a", "d", "f"]
    assert leaders(tree) == ["a", "e"]
    assert depth(tree) == 2


def test_groups_are_balanced() -> None:
    # 5 members in groups of about 2: [a b] [c d] [e], never a 4-and-1 split.
    tree = build_tree(["a", "b", "c", "d", "e"], 2, root="a")
    assert tree["b"] == "a" and tree["d"] == "c"


def test_single_member() -> None:
    tree = build_tree(["only"], 4, "only")
    assert tree == {"only": None}
    assert depth(tree) == 0 and leaders(tree) == ["only"] and children(tree, "only") == []


def test_flat_when_group_is_large_enough() -> None:
    tree = build_tree(_members(5), 8, "peer-003")
    assert all(p == "peer-003" for m, p in tree.items() if m != "peer-003")


@pytest.mark.parametrize(
    ("members", "group_size", "root", "match"),
    [
        ([], 4, "a", "empty"),
        (["a", "b"], 4, "z", "not a member"),
        (["a", "b", "a"], 4, "a", "duplicates"),
        (["a", "b"], 1, "a", "group_size"),
        (["a", "b"], 2.5, "a", "integer"),
    ],
)
def test_build_tree_bad_arguments(
    members: list[str], group_size: int, root: str, match: str
) -> None:
    with pytest.raises(AggregationError, match=match):
        build_tree(members, group_size, root)


@pytest.mark.parametrize(
    "parent_map",
    [
        {"a": "b", "b": "a", "c": None},
        {"a": None, "b": None},
        {"a": "ghost", "b": None},
        {"a": "a"},
    ],
)
def test_depth_rejects_non_trees(parent_map: dict[str, str | None]) -> None:
    with pytest.raises(AggregationError):
        depth(parent_map)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 200), g=st.integers(2, 8), data=st.data())
def test_tree_shape_rules(n: int, g: int, data: st.DataObject) -> None:
    members = _members(n)
    root = data.draw(st.sampled_from(members))
    tree = build_tree(members, g, root)
    assert list(tree) == members
    assert tree == build_tree(list(members), g, root)  # deterministic
    assert tree[root] is None
    assert sum(p is None for p in tree.values()) == 1
    bound = math.ceil(math.log(n, g) - 1e-9) if n > 1 else 0
    assert depth(tree) <= bound  # also proves every chain reaches the root
    for leader in leaders(tree):
        # a group has at most g members, leader included, at each level it leads
        assert len(children(tree, leader)) <= (g - 1) * max(1, bound)


@settings(max_examples=120, deadline=None)
@given(
    n=st.integers(1, 60),
    g=st.integers(2, 8),
    size=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_hierarchical_equals_flat(
    n: int, g: int, size: int, seed: int, data: st.DataObject
) -> None:
    members = _members(n)
    root = data.draw(st.sampled_from(members))
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-3, 3)
    vectors = {m: (rng.standard_normal(size) * scale).astype(np.float32) for m in members}
    weights = {m: float(w) for m, w in zip(members, 10.0 ** rng.uniform(-3, 3, n), strict=True)}
    tree = build_tree(members, g, root)
    flat = weighted_mean(list(vectors.values()), list(weights.values()))
    hier = hierarchical_mean(tree, vectors, weights)
    tol = 1e-6 * max(float(np.abs(v).max()) for v in vectors.values())
    np.testing.assert_allclose(hier, flat, rtol=0, atol=tol)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 40), g=st.integers(2, 5), seed=st.integers(0, 2**32 - 1))
def test_absent_members_are_skipped_but_relay(n: int, g: int, seed: int) -> None:
    members = _members(n)
    rng = np.random.default_rng(seed)
    tree = build_tree(members, g, members[-1])
    present = [m for m in members if rng.random() < 0.6] or [members[0]]
    vectors = {m: rng.standard_normal(5).astype(np.float32) for m in present}
    weights = {m: float(rng.uniform(1, 100)) for m in present}
    flat = weighted_mean(list(vectors.values()), list(weights.values()))
    np.testing.assert_allclose(hierarchical_mean(tree, vectors, weights), flat, atol=1e-6)


def test_absent_leader_forwards_children() -> None:
    tree = build_tree(["a", "b", "c", "d"], 2, "c")  # a leads b; c leads a, d
    vectors = {"b": np.array([2.0]), "d": np.array([6.0])}
    out = hierarchical_mean(tree, vectors, {"b": 1.0, "d": 3.0})
    assert out[0] == pytest.approx(5.0)


def test_hierarchical_errors() -> None:
    tree = build_tree(["a", "b"], 2, "a")
    with pytest.raises(AggregationError, match="no member"):
        hierarchical_mean(tree, {}, {})
    with pytest.raises(AggregationError, match="non-members"):
        hierarchical_mean(tree, {"z": np.ones(1)}, {"z": 1.0})
    with pytest.raises(AggregationError, match="no weight"):
        hierarchical_mean(tree, {"a": np.ones(1)}, {})
    with pytest.raises(AggregationError, match="not in the tree"):
        children(tree, "z")
