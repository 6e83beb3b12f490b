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
from aggregation.tree import fan_out, group_sizes, tree_groups


def _members(n: int) -> list[str]:
    return [f"peer-{i:03d}" for i in range(n)]


def test_small_tree_by_hand() -> None:
    tree = build_tree(["a", "b", "c", "d", "e", "f"], 3, root="e")
    # fan-out 2, the root first: e a b c d f. A heap of 6 has 3 inner nodes; the groups are
    # [e] [a b c] [d f]: a and d under e (e's own group has no room left), b c under a, f under d.
    assert group_sizes(6, 3) == [1, 3, 2]
    assert tree == {"a": "e", "b": "a", "c": "a", "d": "e", "e": None, "f": "d"}
    assert children(tree, "e") == ["a", "d"]
    assert leaders(tree) == ["a", "d", "e"]
    assert depth(tree) == 2


def test_a_leader_leads_one_group_only() -> None:
    # 64 members, groups of 8: the old tree gave the root 7 children at each of two levels.
    tree = build_tree(_members(64), 8, root="peer-000")
    assert max(len(children(tree, m)) for m in tree) == 7
    assert depth(tree) == 3


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
    fan = fan_out(g)
    # a complete fan-ary tree: depth d holds up to 1 + fan + ... + fan**d members
    bound = math.ceil(math.log(n * (fan - 1) + 1, fan) - 1e-9) - 1 if n > 1 else 0
    assert depth(tree) <= bound  # also proves every chain reaches the root
    for leader in leaders(tree):
        assert 1 <= len(children(tree, leader)) <= fan or (n == 1 and leader == root)


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
    tree = build_tree(["a", "b", "c", "d"], 2, "c")  # c leads a, b; b leads d (a heap of fan-out 2)
    assert tree == {"a": "c", "b": "c", "c": None, "d": "b"}
    vectors = {"a": np.array([2.0]), "d": np.array([6.0])}  # b sent nothing of its own
    out = hierarchical_mean(tree, vectors, {"a": 1.0, "d": 3.0})
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


@settings(max_examples=200, deadline=None)
@given(
    n_public=st.integers(1, 60),
    n_private=st.integers(0, 300),
    g=st.integers(2, 16),
    size=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_no_node_has_more_than_group_size_children(
    n_public: int, n_private: int, g: int, size: int, seed: int
) -> None:
    """Whatever the members and the share of them that can accept connections, no node has
    more than ``group_size`` children, a node leads one group, and the hierarchical mean
    is the flat one. Members ordered as placement orders them (the reachable at the head of
    the groups, ``tree_groups``) get reachable leaders whenever there are enough."""
    public = [f"pub{i:03d}" for i in range(n_public)]
    private = [f"priv{i:03d}" for i in range(n_private)]
    n = n_public + n_private
    groups = group_sizes(n, g)
    assert sum(groups) == n and all(s >= 1 for s in groups)
    heads = (public + private)[: len(groups)]  # reachable members lead while there are any
    rest = (public + private)[len(groups):]
    ordered: list[str] = []
    for head, k in zip(heads, groups, strict=True):
        ordered += [head, *rest[: k - 1]]
        rest = rest[k - 1:]
    assert [grp[0] for grp in tree_groups(ordered, g)] == heads
    tree = build_tree(ordered, g, ordered[0])
    most = max(len(children(tree, m)) for m in tree)
    assert most <= g and most <= fan_out(g)
    if len(groups) <= n_public:
        assert set(leaders(tree)) <= set(public)
    rng = np.random.default_rng(seed)
    vectors = {m: rng.standard_normal(size).astype(np.float32) for m in ordered}
    weights = {m: float(rng.uniform(1, 100)) for m in ordered}
    flat = weighted_mean(list(vectors.values()), list(weights.values()))
    np.testing.assert_allclose(hierarchical_mean(tree, vectors, weights), flat, atol=1e-5)
