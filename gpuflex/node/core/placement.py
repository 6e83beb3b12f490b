"""Where members sit in a round's group tree, given who can accept connections.

A leader and the root receive updates, so they must be reachable by their children; a member
behind NAT only ever dials out. ``order_for_tree`` orders the members so that
``aggregation.tree.build_tree`` (which makes the first member of each group its leader) puts
reachable nodes at the head of every group; when there are too few to lead groups of the
job's size, home nodes reached through a relay and a hole punch lead too, and only when even
those are too few are the groups widened. Members much slower than the others (in a
time-budgeted job) are placed as leaves too, when there are enough others to lead. With no
member known to be private or slow the order is the plain one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from aggregation.tree import ParentMap, cut_groups, group_sizes
from gpuflex.node.core.workfields import HEX_DIGITS
from mesh.netprefix import network_prefix
from mesh.vivaldi import Coordinate


def order_for_tree(me: str, members: Sequence[str], private: Collection[str],
                   group_size: int, slow: Collection[str] = (), punched: Collection[str] = (),
                   coords: Mapping[str, Coordinate] | None = None,
                   unsure: Collection[str] = ()) -> tuple[list[str], int]:
    """The member order for the plan and the group size to cut it with; ``me`` is the root.

    Leaders are reachable members, the ones not ``slow`` first: a slow leader would fold its
    group's updates, and send them on, at its own pace. Then, when those are too few to lead
    groups of ``group_size``, the ``punched`` ones among the private (home nodes reached through
    a relay and a hole punch), then the ``unsure`` ones (listed as private: the coordinator
    knows nothing of their reachability, and one may be a home nobody can dial): they lead
    rather than any leader taking more than ``group_size`` members. Groups grow past
    ``group_size`` only when even those are too few.

    With the members' network coordinates (``coords``, ``mesh.vivaldi``) for most of them, the
    groups are cut by nearness instead (``near_groups``), when every group then has a leader
    as reachable as the plain order would give it.

    The tree's fan-out is ``group_size - 1`` (groups of ``group_size``), or ``group_size``
    itself, the cap on children, when that needs fewer leaders and the public members are
    too few to lead the smaller groups: a home leader is slower, and one that some members
    cannot reach costs them a timeout, so public members take one more child first."""
    others = [p for p in members if p != me]
    n = len(others) + 1
    size = max(2, group_size)
    fit = 1 + sum(p not in private and p not in slow for p in others)
    if len(group_sizes(n, size)) > fit and len(group_sizes(n, size + 1)) < len(group_sizes(n, size)):
        size += 1  # fan-out group_size: within the cap, fewer leaders from home
    if coords is not None and sum(p in coords for p in members) * 2 >= len(members) > size:
        near = near_groups(me, members, private, size, slow, punched, coords, unsure)
        if near is not None:
            return near, size
    priv = [p for p in others if p in private]
    late = [p for p in others if p in slow and p not in private]
    if not priv and not late:
        return [me, *others], size
    reach = [me] + [p for p in others if p not in private and p not in slow] + late
    needed = len(group_sizes(n, size))
    if needed > len(reach):  # too few directly reachable leaders: hole-punched homes lead too
        holes = [p for p in priv if p in punched] + [p for p in priv if p in unsure and p not in punched]
        reach += holes[: needed - len(reach)]
        priv = [p for p in priv if p not in reach]
    if needed > len(reach):  # still too few: fewer, larger groups, one per reachable leader
        size = max(size, -(-(n - 1) // len(reach)) + 1)
    sizes = group_sizes(n, size)
    leaders = (reach + priv)[:len(sizes)]
    pool = [p for p in priv + reach if p not in leaders]
    ordered: list[str] = []
    for leader, k in zip(leaders, sizes, strict=True):
        ordered += [leader, *pool[: k - 1]]
        pool = pool[k - 1:]
    return ordered, size


#: ``_rank`` of a member behind NAT with no hole punch: its children could not reach it.
UNREACHABLE = 5


def _rank(peer: str, me: str, private: Collection[str], slow: Collection[str], punched: Collection[str],
          unsure: Collection[str] = ()) -> int:
    """How fit ``peer`` is to lead (smaller is fitter): the root, then reachable and not slow,
    reachable and slow, hole-punched, of unknown reachability, then behind NAT."""
    if peer == me:
        return 0
    if peer not in private:
        return 1 if peer not in slow else 2
    return 3 if peer in punched else 4 if peer in unsure else UNREACHABLE


def _bisect(points: list[str], sizes: list[int], at: Mapping[str, Coordinate]) -> list[list[str]]:
    """``points`` cut into groups of ``sizes`` (in order) by recursive halving along the wider
    axis: each group is compact, and groups next to each other in the list are near too."""
    if len(sizes) == 1:
        return [points]
    xs = [at[p].x for p in points]
    ys = [at[p].y for p in points]
    axis = 0 if max(xs) - min(xs) >= max(ys) - min(ys) else 1
    ordered = sorted(points, key=lambda p: ((at[p].x, at[p].y) if axis == 0 else (at[p].y, at[p].x), p))
    half = len(sizes) // 2
    cut = sum(sizes[:half])
    return _bisect(ordered[:cut], sizes[:half], at) + _bisect(ordered[cut:], sizes[half:], at)


def near_groups(me: str, members: Sequence[str], private: Collection[str], group_size: int,
                slow: Collection[str], punched: Collection[str], coords: Mapping[str, Coordinate],
                unsure: Collection[str] = ()) -> list[str] | None:
    """The member order for groups of nearby members (by network coordinates), each led by its
    fittest member (``_rank``), nearest the group's others among equals; ``build_tree`` cuts
    exactly these groups, and groups their leaders in the same order, so upper levels are
    near too. None when some group would get a less fit leader than the plain order gives
    (a group of homes only, while reachable members lead elsewhere), or a leader nobody can
    reach (behind NAT, no hole punch): the caller falls back to the plain order, which widens
    the groups instead."""
    everyone = list(dict.fromkeys(members))
    size = max(2, group_size)
    at = {p: coords.get(p, Coordinate()) for p in everyone}
    sizes = group_sizes(len(everyone), size)
    # The root's group (the first) is the root and its nearest members; the rest are cut by
    # halving, so groups next to each other in the order, which share a parent, are near.
    rest = sorted((p for p in everyone if p != me), key=lambda p: (at[me].rtt_to(at[p]), p))
    groups = [[me, *rest[: sizes[0] - 1]]]
    if len(sizes) > 1:
        groups += _bisect(sorted(rest[sizes[0] - 1:]), sizes[1:], at)
    fit = sorted(_rank(p, me, private, slow, punched, unsure) for p in everyone)[len(groups) - 1]
    ordered: list[str] = []
    for group in groups:
        leader = min(group, key=lambda p: (_rank(p, me, private, slow, punched, unsure),
                                           sum(at[p].rtt_to(at[q]) for q in group), p))
        rank = _rank(leader, me, private, slow, punched, unsure)
        if rank > max(fit, 1) or (rank == UNREACHABLE and leader != me):
            return None  # the plain order widens the groups rather than have nobody reach a leader
        ordered += [leader, *(p for p in group if p != leader)]
    return ordered


def cap_per_prefix(members: Sequence[str], ip_of: Callable[[str], str | None], limit: int,
                   first: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """(kept, dropped): at most ``limit`` members per network prefix (``mesh.netprefix``).

    ``first`` (this node, the job's known members) keep their places before newcomers from the
    same network; ties go by peer id, so the choice is the same whoever makes it. Members with
    no prefix (loopback, an unknown address) are never dropped. ``limit`` 0 keeps everyone."""
    if limit <= 0:
        return list(members), []
    counts: dict[str, int] = {}
    kept, dropped = [], []
    for peer in sorted(members, key=lambda p: (p not in first, p)):
        prefix = network_prefix(ip_of(peer))
        if prefix is not None and counts.get(prefix, 0) >= limit:
            dropped.append(peer)
            continue
        if prefix is not None:
            counts[prefix] = counts.get(prefix, 0) + 1
        kept.append(peer)
    order = {p: i for i, p in enumerate(members)}
    return sorted(kept, key=order.__getitem__), dropped


# -- secure aggregation: groups from public randomness ------------------------------------------


def secagg_nonce(sign: Callable[[bytes], bytes], job: str, round_: int) -> str:
    """This member's secret share of the draw of ``round_ + 1``'s groups: the hash of its own
    signature over the job and the round. Nobody else can compute it before the member reveals
    it, and the member gets the same one after a restart (Ed25519 signs deterministically), so
    it keeps no state. Its update of round ``round_ - 1`` commits to it (``nonce_commitment``)."""
    return hashlib.blake2b(sign(f"gpuflex/secagg-nonce|{job}|{round_}".encode()), digest_size=32).hexdigest()


def nonce_commitment(nonce: str) -> str:
    return hashlib.blake2b(b"gpuflex/secagg-commit|" + bytes.fromhex(nonce), digest_size=32).hexdigest()


def revealed_nonces(last: Sequence[Mapping[str, Any]], before: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Peer -> nonce, for each contributor of the last result (``last``: its contributor rows,
    checked against the signed updates) whose nonce matches the commitment its update made in
    the result before (``before``). A nonce with no such commitment counts for nothing: its
    owner could have chosen it after seeing the others'."""
    commits = {row.get("peer"): row.get("commit") for row in before if isinstance(row, Mapping)}
    out: dict[str, str] = {}
    for row in last:
        peer, nonce = (row.get("peer"), row.get("nonce")) if isinstance(row, Mapping) else (None, None)
        if isinstance(peer, str) and isinstance(nonce, str) and len(nonce) == 64 and not nonce.strip(HEX_DIGITS) \
                and commits.get(peer) == nonce_commitment(nonce):
            out[peer] = nonce
    return out


def group_seed(job: str, round_: int, reveals: Mapping[str, str] | None = None) -> bytes:
    """The public randomness a masked round's groups come from: the job, the round and the
    nonces revealed in the previous round (``revealed_nonces``), nothing a coordinator or a
    root can choose beyond which contributions a result includes."""
    drawn = ",".join(f"{peer}={nonce}" for peer, nonce in sorted((reveals or {}).items()))
    return hashlib.blake2b(f"gpuflex/secagg-groups|{job}|{round_}|{drawn}".encode(), digest_size=32).digest()


def group_draw(job: str, round_: int, last: Sequence[Mapping[str, Any]],
               before: Sequence[Mapping[str, Any]]) -> tuple[bytes, frozenset[str] | None]:
    """The seed of ``round_``'s groups and the members it places by seed (the established:
    they revealed a nonce committed a round earlier, so their keys were fixed before anyone
    knew the seed). None: nobody has yet (the job's first two rounds), everyone is placed."""
    reveals = revealed_nonces(last, before)
    return group_seed(job, round_, reveals), (frozenset(reveals) if reveals else None)


def masked_tree(root: str, members: Sequence[str], private: Collection[str], group_size: int,
                min_group: int, seed: bytes, established: Collection[str] | None = None) -> ParentMap:
    """The one group tree a masked round may use: who is grouped with whom comes from the
    members and the seed alone, never from what the coordinator says of them; groups are cut
    no smaller than a leader plus ``min_group`` masking members whenever the round has that many
    members at all.

    Only the ``established`` members (None: all) are ordered by the seed and cut into groups.
    The others, keys with no committed nonce, join the root's group: a party that learns the
    seed cannot make fresh keys that land beside a member it targets, and adding keys to the
    root's group takes no honest member out of it.

    ``private`` (the plan's list of members behind NAT, the coordinator's word) only chooses
    who leads inside a group already fixed: its first reachable member in the seed's order, or
    its first member when none is reachable (peers reach it through its relay). Steering the
    groups through that list, as ``order_for_tree`` would (it moves private members between
    groups to put reachable leaders at their head), would let a coordinator put a member in a
    group of its own Sybils."""
    def rank(peer: str) -> bytes:
        return hashlib.blake2b(seed + peer.encode(), digest_size=16).digest()

    others = [p for p in set(members) if p != root]
    placed = sorted((p for p in others if established is None or p in established), key=rank)
    joining = sorted((p for p in others if established is not None and p not in established), key=rank)
    n = len(placed) + 1
    size = max(2, group_size)
    count = -(-n // size)
    if count > 1 and n // count < min_group + 1:  # the smallest group would mask too few
        count = max(1, n // (min_group + 1))
        size = -(-n // count)
    groups = cut_groups([root, *placed], size)  # the bottom groups build_tree would make
    groups[0] += joining
    parents: ParentMap = {}
    leaders = []
    for group in groups:
        lead = 0 if root in group else next((i for i, p in enumerate(group) if p not in private), 0)
        leaders.append(group[lead])
        for p in [group[lead], *group[:lead], *group[lead + 1:]]:
            parents[p] = None if p == group[lead] else group[lead]
    return {p: _leaders_grouped(leaders, size, root).get(p, parent) for p, parent in parents.items()}


def _leaders_grouped(leaders: list[str], size: int, root: str) -> ParentMap:
    """A masked round's upper levels: the leaders are cut into groups of ``size`` again, level
    by level, each led by its first (or the root), so a leader leads at every level it
    reaches. Unlike ``build_tree``, whose upper leaders lead smaller bottom groups, this keeps
    every masked group at ``size`` (at least ``min_group`` masking members), at the price of
    up to ``size - 1`` children per level at the root."""
    parents: ParentMap = dict.fromkeys(leaders)
    level = leaders
    while len(level) > 1:
        next_level = []
        for group in cut_groups(level, size):
            leader = root if root in group else group[0]
            for member in group:
                if member != leader:
                    parents[member] = leader
            next_level.append(leader)
        level = next_level
    return parents
