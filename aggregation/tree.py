"""The group tree of a round: who sends their update to whom.

Every node computes the tree from the signed member list alone, so the plan
must be a pure function of its inputs: no hashing of Python objects, no set
iteration, only the members' given order. The tree is a complete
``fan_out(group_size)``-ary tree over groups: the member list is cut into
consecutive groups (``group_sizes``), each led by its first member, the
root's group first; the group leaders form a heap under the root (leader
``j`` under leader ``(j - 1) // fan``), and a leader's own group fills the
places its leader children leave. So a node leads one group at one level
only, no node ever has more than ``fan_out(group_size)`` children (at most
``group_size - 1`` for groups of three or more), and the depth is about
log_fan(n): neither a leader's inbound bandwidth nor what it sends back down
grows with the size of the mesh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from aggregation._checks import check_int
from aggregation.errors import AggregationError
from aggregation.weighted import WeightedAccumulator

ParentMap = dict[str, str | None]


def cut_groups(nodes: list[str], group_size: int) -> list[list[str]]:
    """Split ``nodes`` into ceil(n/g) consecutive groups whose sizes differ by at most one.

    Balanced sizes avoid a trailing group of one, whose leader would only add
    a hop without sharing any work.
    """
    count = -(-len(nodes) // group_size)
    base, extra = divmod(len(nodes), count)
    groups, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        groups.append(nodes[start:stop])
        start = stop
    return groups


def fan_out(group_size: int) -> int:
    """The most children a node has in a tree cut with ``group_size``: a leader and
    ``group_size - 1`` others make a group, except that groups of two would make a chain,
    so the fan-out is at least 2."""
    return max(2, check_int(group_size, "group_size", low=2) - 1)


def group_sizes(count: int, group_size: int) -> list[int]:
    """Sizes of the groups ``build_tree`` cuts ``count`` members into, in order, the root's
    group first; each group is its leader and the leaf members it leads.

    The groups' leaders are the internal nodes of a complete ``fan_out(group_size)``-ary
    tree in breadth-first order (the first ``ceil((count - 1) / fan)`` of the heap), so the
    upper leaders lead small groups or none: a leader's children, leaders and leaves
    together, never exceed the fan-out. Every group has at least its leader, and every
    leader but a lone root has at least one child."""
    count = check_int(count, "count", low=1)
    fan = fan_out(group_size)
    if count == 1:
        return [1]
    leaders = -(-(count - 1) // fan)
    sizes = [1] * leaders
    for i in range(leaders, count):  # the heap's leaves, each under its heap parent
        sizes[(i - 1) // fan] += 1
    return sizes


def tree_groups(nodes: Sequence[str], group_size: int) -> list[list[str]]:
    """``nodes`` cut into consecutive groups of ``group_sizes``: the groups ``build_tree``
    makes of this order (the first group is the root's)."""
    groups, start = [], 0
    for size in group_sizes(len(nodes), group_size):
        groups.append(list(nodes[start:start + size]))
        start += size
    return groups


def build_tree(members: Sequence[str], group_size: int, root: str) -> ParentMap:
    """Return the parent of every member; the root maps to None.

    The members, the root moved to the front, are cut into ``tree_groups``; each group's
    first member leads its other members, and leader ``j`` (in group order) has leader
    ``(j - 1) // fan_out(group_size)`` as its parent. No node has more than the fan-out's
    children, however many members there are. The dict keeps the members' given order.
    """
    group_size = check_int(group_size, "group_size", low=2)
    nodes = list(members)
    if not nodes:
        raise AggregationError("members is empty: a round needs at least one member")
    if len(set(nodes)) != len(nodes):
        raise AggregationError("members contains duplicates")
    if root not in nodes:
        raise AggregationError(f"root {root!r} is not a member")
    parents: ParentMap = dict.fromkeys(nodes)
    fan = fan_out(group_size)
    heads: list[str] = []
    for j, group in enumerate(tree_groups([root, *(m for m in nodes if m != root)], group_size)):
        heads.append(group[0])
        if j:
            parents[group[0]] = heads[(j - 1) // fan]
        for member in group[1:]:
            parents[member] = group[0]
    return parents


def _check_node(parent_map: Mapping[str, str | None], node: str) -> None:
    if node not in parent_map:
        raise AggregationError(f"{node!r} is not in the tree")


def children(parent_map: Mapping[str, str | None], node: str) -> list[str]:
    """Members whose parent is ``node``, in the members' order."""
    _check_node(parent_map, node)
    return [member for member, parent in parent_map.items() if parent == node]


def _hops(parent_map: Mapping[str, str | None]) -> dict[str, int]:
    """Distance of every member to the root, rejecting maps that are not a tree.

    Parent maps also arrive from the network (inside a signed plan), so a
    cycle, a dangling parent or a second root must be an error, not a hang.
    """
    roots = [member for member, parent in parent_map.items() if parent is None]
    if len(roots) != 1:
        raise AggregationError(f"a tree needs exactly one root, found {len(roots)}")
    hops: dict[str, int] = {roots[0]: 0}
    for start in parent_map:
        path: list[str] = []
        node = start
        while node not in hops:
            path.append(node)
            parent = parent_map[node]
            if parent is None or parent not in parent_map:
                raise AggregationError(f"{node!r} has parent {parent!r}, which is not a member")
            if len(path) > len(parent_map):
                raise AggregationError(f"the parent chain of {start!r} has a cycle")
            node = parent
        base = hops[node]
        for offset, member in enumerate(reversed(path), start=1):
            hops[member] = base + offset
    return hops


def depth(parent_map: Mapping[str, str | None]) -> int:
    """Largest number of hops from a member to the root (0 for a lone root)."""
    if not parent_map:
        raise AggregationError("the tree is empty")
    return max(_hops(parent_map).values())


def leaders(parent_map: Mapping[str, str | None]) -> list[str]:
    """Members that reduce something: the root, and every member with children."""
    has_children = {parent for parent in parent_map.values() if parent is not None}
    return [m for m, parent in parent_map.items() if parent is None or m in has_children]


def hierarchical_mean(
    parent_map: Mapping[str, str | None],
    vectors: Mapping[str, np.ndarray],
    weights: Mapping[str, float],
) -> np.ndarray:
    """Reduce bottom-up exactly as the nodes do, and return the root's mean.

    Each member combines its own update with its children's partial means,
    each partial weighted by the total weight under it; that is what makes
    the tree result equal the flat weighted mean. Members absent from
    ``vectors`` contribute nothing, but still forward their children's
    partial, as a leader whose own training failed still relays.
    """
    hops = _hops(parent_map)
    unknown = [m for m in vectors if m not in parent_map]
    if unknown:
        raise AggregationError(f"vectors for non-members: {unknown[:5]}")
    missing = [m for m in vectors if m not in weights]
    if missing:
        raise AggregationError(f"no weight for members: {missing[:5]}")
    partials: dict[str, tuple[np.ndarray, float]] = {}
    for node in sorted(parent_map, key=lambda m: -hops[m]):
        acc = WeightedAccumulator()
        if node in vectors:
            acc.add(vectors[node], weights[node])
        for child in children(parent_map, node):
            if child in partials:
                mean, weight = partials[child]
                acc.add(mean, weight)
        if acc.count and acc.total_weight > 0:
            partials[node] = (acc.result(), acc.total_weight)
    root = next(m for m, parent in parent_map.items() if parent is None)
    if root not in partials:
        raise AggregationError("no member with positive weight is present")
    return partials[root][0]
