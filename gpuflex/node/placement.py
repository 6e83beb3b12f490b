"""Where members sit in a round's group tree, given who can accept connections.

A leader and the root receive updates, so they must be reachable by their children; a member
behind NAT only ever dials out. ``order_for_tree`` orders the members so that
``aggregation.tree.build_tree`` (which makes the first member of each group its leader) puts
reachable nodes at the head of every group, and widens the groups when there are too few
reachable nodes to lead groups of the job's size. With no member known to be private the
order is the plain one, so meshes of public nodes plan exactly as before.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def order_for_tree(me: str, members: Sequence[str], private: Collection[str],
                   group_size: int) -> tuple[list[str], int]:
    """The member order for the plan and the group size to cut it with; ``me`` is the root."""
    others = [p for p in members if p != me]
    priv = [p for p in others if p in private]
    if not priv:
        return [me, *others], group_size
    reach = [me] + [p for p in others if p not in private]
    n = len(others) + 1
    size = max(2, group_size)
    if -(-n // size) > len(reach):  # too few reachable leaders: fewer, larger groups
        size = max(size, -(-n // len(reach)))
    count = -(-n // size)
    base, extra = divmod(n, count)
    sizes = [base + (1 if i < extra else 0) for i in range(count)]
    leaders = (reach + priv)[:count]
    pool = [p for p in priv + reach if p not in leaders]
    ordered: list[str] = []
    for leader, k in zip(leaders, sizes, strict=True):
        ordered += [leader, *pool[: k - 1]]
        pool = pool[k - 1:]
    return ordered, size
