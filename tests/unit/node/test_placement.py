from hypothesis import given
from hypothesis import strategies as st

from aggregation.tree import build_tree
from gpuflex.node.placement import order_for_tree


@given(st.integers(1, 30), st.integers(0, 30), st.integers(2, 6))
def test_leaders_are_reachable_whenever_any_are(n_public: int, n_private: int, group_size: int) -> None:
    public = [f"pub{i}" for i in range(n_public)]
    private = [f"priv{i}" for i in range(n_private)]
    me = public[0]
    members = [*sorted(public[1:] + private), me]
    ordered, size = order_for_tree(me, members, set(private), group_size)
    assert sorted(ordered) == sorted(members) and ordered[0] == me
    parent = build_tree(ordered, size, me)
    receivers = {p for p in parent.values() if p is not None}
    assert receivers <= set(public), f"private leaders: {receivers - set(public)}"
    assert size == group_size or -(-len(members) // group_size) > n_public


def test_no_private_member_keeps_the_plain_order() -> None:
    assert order_for_tree("a", ["c", "a", "b"], set(), 2) == (["a", "c", "b"], 2)


def test_private_coordinator_still_roots_the_tree() -> None:
    ordered, size = order_for_tree("x", ["x", "p1", "p2"], {"x", "p1", "p2"}, 2)
    assert ordered[0] == "x" and build_tree(ordered, size, "x")["x"] is None
