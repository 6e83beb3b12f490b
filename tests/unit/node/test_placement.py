import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation.tree import build_tree, children, fan_out, group_sizes, tree_groups
from gpuflex.node.core.placement import order_for_tree
from mesh.vivaldi import MAX_MS, Coordinate, from_wire, observe


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
    assert size == group_size or len(group_sizes(len(members), group_size)) > n_public
    assert max(len(children(parent, p)) for p in parent) <= fan_out(size)


def test_no_private_member_keeps_the_plain_order() -> None:
    assert order_for_tree("a", ["c", "a", "b"], set(), 2) == (["a", "c", "b"], 2)


def test_private_coordinator_still_roots_the_tree() -> None:
    ordered, size = order_for_tree("x", ["x", "p1", "p2"], {"x", "p1", "p2"}, 2)
    assert ordered[0] == "x" and build_tree(ordered, size, "x")["x"] is None


@given(st.integers(2, 30), st.integers(0, 10), st.integers(0, 10), st.integers(2, 6))
def test_slow_members_lead_no_group_while_enough_others_can(n_fast: int, n_slow: int, n_private: int,
                                                             group_size: int) -> None:
    fast = [f"fast{i}" for i in range(n_fast)]
    slow = [f"slow{i}" for i in range(n_slow)]
    private = [f"priv{i}" for i in range(n_private)]
    me = fast[0]
    members = [*sorted(fast[1:] + slow + private), me]
    ordered, size = order_for_tree(me, members, set(private), group_size, set(slow))
    assert sorted(ordered) == sorted(members) and ordered[0] == me
    parent = build_tree(ordered, size, me)
    receivers = {p for p in parent.values() if p is not None}
    assert not receivers & set(private), "groups are widened before a private member leads one"
    assert max(len(children(parent, p)) for p in parent) <= fan_out(size)
    if len(group_sizes(len(members), size)) <= n_fast:  # enough fast members to lead every group
        assert receivers <= set(fast), f"slow or private leaders: {receivers - set(fast)}"


def test_four_members_with_one_slow_put_it_under_a_fast_leader() -> None:
    ordered, size = order_for_tree("a", ["a", "b", "c", "s"], set(), 2, {"s"})
    parent = build_tree(ordered, size, "a")
    assert parent["s"] in {"a", "b", "c"} and "s" not in parent.values()


# -- secure-aggregation groups from public randomness; the per-network cap ----------------------


@settings(deadline=None)  # a loaded machine must not fail a property on time
@given(st.integers(3, 40), st.integers(2, 8), st.integers(2, 5), st.binary(min_size=32, max_size=32))
def test_masked_groups_come_from_the_seed_and_mask_at_least_the_minimum(n: int, group_size: int, min_group: int,
                                                                        seed: bytes) -> None:
    from gpuflex.node.core.placement import masked_tree
    from gpuflex.node.core.secure import mask_group

    members = [f"peer{i:02d}" for i in range(n)]
    tree = masked_tree(members[0], members, (), group_size, min_group, seed)
    # Any coordinator, given the members in any order, builds the same tree: no one chooses.
    assert tree == masked_tree(members[0], list(reversed(members)), (), group_size, min_group, seed)
    assert sorted(tree) == members and tree[members[0]] is None
    leaders = {parent for parent in tree.values() if parent is not None}
    masking = [mask_group(tree, p)[1] for p in members if p not in leaders]  # a leaf masks its update
    if n >= min_group + 1:  # enough members for one full group: nobody masks into a smaller one
        assert all(len(group) >= min_group for group in masking if group), (tree, masking)


def test_different_revealed_nonces_reshuffle_the_groups() -> None:
    from gpuflex.node.core.placement import group_seed, masked_tree

    members = [f"peer{i:02d}" for i in range(12)]
    trees = {tuple(masked_tree(members[0], members, (), 4, 3, group_seed("job", 3, {"peer01": n * 64})).items())
             for n in "abcd"}
    assert len(trees) > 1


def _rows(peers: list[str], job: str, round_: int, secrets: dict[str, bytes], **extra: object) -> list[dict]:
    """Contributor rows of round ``round_`` as a result records them: each peer's nonce of this
    round (from its secret, as its signature would give) and its commitment to the next."""
    import hashlib

    from gpuflex.node.core.placement import nonce_commitment, secagg_nonce

    def sign_for(peer: str):  # a deterministic stand-in for the peer's signature
        return lambda message: hashlib.blake2b(secrets[peer] + message).digest()

    return [{"peer": p, "samples": 1, "nonce": secagg_nonce(sign_for(p), job, round_),
             "commit": nonce_commitment(secagg_nonce(sign_for(p), job, round_ + 1)), **extra} for p in peers]


@given(st.integers(2, 12), st.integers(0, 6), st.binary(min_size=8, max_size=8), st.dictionaries(
    st.sampled_from(["accuracy", "loss", "duration_s", "note"]), st.floats(allow_nan=False), max_size=4))
def test_the_draw_depends_on_committed_nonces_alone(n: int, late: int, salt: bytes, metrics: dict) -> None:
    """What a root can vary in its result (metrics, a re-signature, so its digest) does not move
    the seed; a nonce that no earlier commitment binds (chosen after seeing the others') counts
    for nothing, and neither does a contributor whose nonce differs from what it committed to."""
    from gpuflex.node.core.placement import group_draw, group_seed

    peers = [f"peer{i:02d}" for i in range(n)]
    newcomers = [f"new{i}" for i in range(late)]
    secrets = {p: salt + p.encode() for p in peers + newcomers}
    before = _rows(peers, "job", 2, secrets)
    last = _rows(peers + newcomers, "job", 3, secrets, metrics=metrics)
    seed, placed = group_draw("job", 4, last, before)
    assert placed == frozenset(peers), "only nonces committed a round earlier count"
    assert seed == group_draw("job", 4, _rows(peers + newcomers, "job", 3, secrets), before)[0]
    assert seed == group_seed("job", 4, {r["peer"]: r["nonce"] for r in last if r["peer"] in peers})
    liar = {**last[0], "nonce": "0" * 64}  # a nonce other than the one it committed to
    assert group_draw("job", 4, [liar, *last[1:]], before)[1] == frozenset(peers[1:]) or n == 1


@given(st.integers(3, 24), st.integers(2, 6), st.integers(2, 4), st.binary(min_size=32, max_size=32),
       st.integers(1, 12), st.binary(min_size=4, max_size=4))
def test_keys_that_arrive_after_the_draw_never_join_an_established_members_group(
        n: int, group_size: int, min_group: int, seed: bytes, fresh: int, salt: bytes) -> None:
    """A party that knows the seed and makes keys to land beside a member it targets: whatever
    keys it makes, they join the root's group alone, and every established member masks with the
    same established members as without them."""
    from gpuflex.node.core.placement import masked_tree
    from gpuflex.node.core.secure import mask_group

    members = [f"peer{i:02d}" for i in range(n)]
    sybils = [f"fresh{salt.hex()}{i}" for i in range(fresh)]
    plain = masked_tree(members[0], members, (), group_size, min_group, seed, established=members)
    crowded = masked_tree(members[0], members + sybils, (), group_size, min_group, seed, established=members)

    def group(tree: dict[str, str | None], p: str) -> frozenset[str]:
        leader, masking = mask_group(tree, p)
        return frozenset({leader, *masking})

    assert sorted(crowded) == sorted(members + sybils)
    for p in members:
        assert group(crowded, p) - set(sybils) == group(plain, p), p
        assert not group(crowded, p) & set(sybils) or members[0] in group(crowded, p), p
    assert all(mask_group(crowded, s)[0] == members[0] for s in sybils), "fresh keys mask in the root's group"
    # Without an established set (the job's first rounds) every member is placed by the seed,
    # as before nonces existed.
    assert masked_tree(members[0], members, (), group_size, min_group, seed) == plain


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 255)), min_size=1, max_size=30), st.integers(1, 4))
def test_at_most_the_cap_per_network_and_loopback_is_exempt(hosts: list[tuple[int, int]], limit: int) -> None:
    from gpuflex.node.core.placement import cap_per_prefix

    ip = {f"p{i}": (f"203.0.{net}.{host}" if net else f"127.0.0.{host}") for i, (net, host) in enumerate(hosts)}
    kept, dropped = cap_per_prefix(list(ip), ip.get, limit, first={"p0"})
    assert sorted(kept + dropped) == sorted(ip) and "p0" in kept
    per_net: dict[str, int] = {}
    for p in kept:
        if not ip[p].startswith("127."):
            per_net[ip[p].rsplit(".", 1)[0]] = per_net.get(ip[p].rsplit(".", 1)[0], 0) + 1
    assert all(count <= limit for count in per_net.values())
    assert not any(ip[p].startswith("127.") for p in dropped)
    assert cap_per_prefix(list(ip), ip.get, 0) == (list(ip), [])


def test_network_prefixes() -> None:
    from mesh.netprefix import network_prefix

    assert network_prefix("203.0.113.7") == "203.0.113.0/24"
    assert network_prefix("2001:db8:1:2::5") == "2001:db8:1::/48"
    assert network_prefix("::ffff:203.0.113.7") == "203.0.113.0/24"
    assert network_prefix("127.0.0.1") is None and network_prefix("::1") is None
    assert network_prefix("not an address") is None and network_prefix(None) is None


@given(st.integers(1, 12), st.integers(0, 40), st.integers(0, 40), st.integers(2, 8))
@settings(deadline=None)  # a loaded machine must not fail a property on time
def test_hole_punched_homes_lead_before_any_group_outgrows_group_size(
        n_public: int, n_punched: int, n_private: int, group_size: int) -> None:
    """A tenth of the members public: the homes reached through a hole punch lead groups too,
    so groups keep ``group_size`` and no node has more children than that allows; the
    unpunched private members never lead while any reachable one could."""
    public = [f"pub{i}" for i in range(n_public)]
    punched = [f"hole{i}" for i in range(n_punched)]
    private = [f"priv{i}" for i in range(n_private)]
    me = public[0]
    members = [*sorted(public[1:] + punched + private), me]
    ordered, size = order_for_tree(me, members, set(punched + private), group_size, punched=set(punched))
    assert sorted(ordered) == sorted(members) and ordered[0] == me
    parent = build_tree(ordered, size, me)
    receivers = {p for p in parent.values() if p is not None}
    groups = len(group_sizes(len(members), group_size))
    assert max(len(children(parent, p)) for p in parent) <= fan_out(size)
    if groups <= n_public:
        assert receivers <= set(public), "homes lead while public members suffice"
    if groups <= n_public + n_punched:
        assert size in (group_size, group_size + 1)  # fan-out group_size - 1, or the cap itself
        assert max(len(children(parent, p)) for p in parent) <= max(2, group_size)
        assert receivers <= set(public + punched), f"unreachable leaders: {receivers - set(public + punched)}"


def test_hundred_members_ten_public_keep_groups_of_eight() -> None:
    public = [f"pub{i}" for i in range(10)]
    punched = [f"hole{i}" for i in range(45)]
    private = [f"priv{i}" for i in range(45)]
    _, size_before = order_for_tree(public[0], public + punched + private, set(punched + private), 8)
    _, size = order_for_tree(public[0], public + punched + private, set(punched + private), 8,
                                   punched=set(punched))
    assert size_before == 11  # without the punched homes: ten public leaders with up to ten children each
    assert size == 9  # fan-out 8, the cap: 13 leaders, of them 3 from home, instead of 15 and 5


@given(st.integers(3, 30), st.integers(2, 6), st.integers(2, 4), st.binary(min_size=32, max_size=32),
       st.sets(st.integers(0, 29)))
def test_masked_groups_do_not_depend_on_the_coordinators_private_list(n: int, group_size: int, min_group: int,
                                                                      seed: bytes, marked: set[int]) -> None:
    """Whatever members the coordinator calls private, every member masks with the same group
    (its group's members are the same); the list only picks a reachable leader inside it."""
    from gpuflex.node.core.placement import masked_tree
    from gpuflex.node.core.secure import mask_group

    members = [f"peer{i:02d}" for i in range(n)]
    private = {members[i] for i in marked if 0 < i < n}
    plain = masked_tree(members[0], members, (), group_size, min_group, seed)
    steered = masked_tree(members[0], members, private, group_size, min_group, seed)

    def group(tree: dict[str, str | None], p: str) -> frozenset[str]:
        leader, masking = mask_group(tree, p)
        return frozenset({leader, *masking})

    assert sorted(steered) == members and steered[members[0]] is None
    for p in members:
        assert group(steered, p) == group(plain, p), p
        leader = mask_group(steered, p)[0]
        if leader != members[0] and any(q not in private for q in group(steered, p)):
            assert leader not in private  # a reachable leader wherever the group has one


def _clustered(n_sites: int, per_site: int, seed: int) -> tuple[list[str], dict[str, Coordinate]]:
    """Members at ``n_sites`` far-apart sites (100 ms apart), a few ms within one."""
    rng = random.Random(seed)
    members, coords = [], {}
    for s in range(n_sites):
        cx, cy = rng.uniform(0, 400), rng.uniform(0, 400)
        for i in range(per_site):
            peer = f"s{s}n{i}"
            members.append(peer)
            coords[peer] = Coordinate(cx + rng.uniform(-3, 3), cy + rng.uniform(-3, 3), 2.0, 0.1)
    rng.shuffle(members)
    return members, coords


def _mean_rtt_to_parent(parent: dict[str, str | None], coords: dict[str, Coordinate]) -> float:
    pairs = [(m, p) for m, p in parent.items() if p is not None]
    return sum(coords[m].rtt_to(coords[p]) for m, p in pairs) / len(pairs)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.integers(2, 12), st.integers(2, 8), st.integers(0, 1000), st.floats(0, 0.9))
def test_groups_by_nearness_keep_the_cap_and_reachable_leaders(n_sites: int, per_site: int, group_size: int,
                                                              seed: int, private_share: float) -> None:
    members, coords = _clustered(n_sites, per_site, seed)
    private = set(members[: int(private_share * len(members))]) - {members[-1]}
    me = members[-1]
    ordered, size = order_for_tree(me, members, private, group_size, coords=coords)
    assert sorted(ordered) == sorted(members)
    reachable = len(members) - len(private)
    if len(group_sizes(len(members), group_size + 1)) <= reachable:
        assert size in (group_size, group_size + 1)  # nearness never widens the groups past the cap
    parent = build_tree(ordered, size, me)
    assert parent[me] is None
    groups = tree_groups(ordered, size)  # the groups build_tree makes of this order
    assert max(len(g) for g in groups) <= fan_out(size) + 1
    if size <= group_size + 1:
        assert max(len(children(parent, p)) for p in parent) <= max(2, group_size)
    leaders = {g[0] for g in groups}
    assert all(parent[m] in leaders or m in leaders for m in members)
    assert not leaders & private, leaders & private  # groups widen before an unreachable home leads


def test_groups_by_nearness_put_leaders_near_their_members() -> None:
    members, coords = _clustered(12, 8, seed=3)
    me = members[0]
    near, size = order_for_tree(me, members, set(), 8, coords=coords)
    plain, plain_size = order_for_tree(me, members, set(), 8)
    after = _mean_rtt_to_parent(build_tree(near, size, me), coords)
    before = _mean_rtt_to_parent(build_tree(plain, plain_size, me), coords)
    assert after < before / 3, (before, after)


def test_vivaldi_coordinates_converge_to_the_measured_round_trips() -> None:
    rng = random.Random(1)
    true = [(rng.uniform(0, 200), rng.uniform(0, 200)) for _ in range(30)]

    def rtt(a: int, b: int) -> float:
        return 2 * (math.dist(true[a], true[b]) + 5)

    coords = [Coordinate() for _ in true]
    for _ in range(4000):
        a, b = rng.sample(range(len(true)), 2)
        coords[a] = observe(coords[a], coords[b], rtt(a, b), rng)
    errors = [abs(coords[a].rtt_to(coords[b]) - rtt(a, b)) / rtt(a, b)
              for a in range(len(true)) for b in range(a + 1, len(true))]
    assert sorted(errors)[len(errors) // 2] < 0.15  # median relative error


@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.booleans(),
                          st.text(max_size=3)), max_size=5))
def test_a_peer_coordinate_from_the_wire_is_bounded_or_refused(value: list[object]) -> None:
    coord = from_wire(value)
    if coord is not None:
        assert all(math.isfinite(v) and abs(v) <= MAX_MS for v in (coord.x, coord.y, coord.height))
        assert 0 <= coord.error <= 1


@given(st.integers(1, 20), st.integers(0, 20), st.integers(0, 20), st.integers(0, 20), st.integers(2, 6))
def test_members_of_unknown_reachability_lead_only_after_the_reachable_and_the_punched(
        n_public: int, n_punched: int, n_unsure: int, n_home: int, group_size: int) -> None:
    """A coordinator that holds no claim of a member's reachability lists it as private: it
    leads only when the reachable and the hole-punched members are too few, before any group
    grows past ``group_size``; a plain home leads no group while any of those could."""
    public = [f"pub{i}" for i in range(n_public)]
    punched = [f"hole{i}" for i in range(n_punched)]
    unsure = [f"unk{i}" for i in range(n_unsure)]
    homes = [f"home{i}" for i in range(n_home)]
    me = public[0]
    members = [me, *sorted(public[1:] + punched + unsure + homes)]
    private = set(punched) | set(unsure) | set(homes)
    ordered, size = order_for_tree(me, members, private, group_size, punched=set(punched), unsure=set(unsure))
    assert sorted(ordered) == sorted(members) and ordered[0] == me
    parent = build_tree(ordered, size, me)
    leaders = {p for p in parent.values() if p is not None}
    needed = len(group_sizes(len(members), size))
    if needed <= n_public:
        assert leaders <= set(public), f"not reachable: {leaders - set(public)}"
    if leaders & set(unsure):
        assert set(punched) <= leaders, "an unknown member leads while a punched home does not"
    if leaders & set(homes):
        assert set(punched) | set(unsure) <= leaders, "a plain home leads while another could"
    assert max(len(children(parent, p)) for p in parent) <= fan_out(size)
