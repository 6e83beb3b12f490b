"""A hostile coordinator steers secure-aggregation groups through the plan's ``private`` list.

Three honest node processes on loopback train one job; the hostile peer (``hostile_peer``)
publishes a secure-aggregation job of eight allowlisted members (itself, the three honest
nodes and four Sybil keys of its own) whose first round it coordinates. Its plan names a
``private`` list chosen so that the victim (node 1) masks its update in a group of only the
coordinator and Sybils. The victim must refuse that plan and send no update to it; the honest
job keeps one ledger.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator

import pytest

from aggregation.tree import build_tree
from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.ledger import Ledger
from gpuflex.node.core.messages import JOB, RESULT, make_plan, parse_result
from gpuflex.node.core.placement import group_draw, group_seed, masked_tree, order_for_tree
from gpuflex.node.core.ranking import coordinator_ranking
from gpuflex.node.core.secure import mask_group
from mesh.codec import open_envelope, seal
from mesh.identity import Identity
from tests.integration.conftest import HONEST_PACE, digits_spec, light_spec, load_factor
from tests.integration.honest_job import assert_one_ledger
from tests.integration.hostile_peer import HostilePeer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
TIMING = {"local_epochs": 1, "plan_timeout_s": 2.0, "train_timeout_s": 10.0, "reduce_timeout_s": 2.0}
GROUP, MIN_GROUP = 4, 3


def steered_tree(root: str, members: list[str], private: set[str], seed: bytes) -> dict[str, str | None]:
    """The groups a coordinator gets by naming ``private`` when the private list moves members
    between groups: the seed's order, then reachable members pulled to the head of each group."""
    import hashlib

    others = sorted((p for p in members if p != root),
                    key=lambda p: hashlib.blake2b(seed + p.encode(), digest_size=16).digest())
    ordered, size = order_for_tree(root, [root, *others], private, GROUP)
    return build_tree(ordered, size, root)


def find_steering(root: str, members: list[str], victim: str, ours: set[str],
                  seed: bytes) -> tuple[dict[str, str | None], set[str]] | None:
    """A private list that puts ``victim`` masking among ``ours`` only, in a tree other than
    the one the seed gives with that list: the fair tree may, by the seed's chance, group the
    victim with our keys too, and a plan that is the fair tree is one the victim rightly takes."""
    others = [p for p in members if p != root]
    for k in range(1, len(others) + 1):
        for private in itertools.combinations(others, k):
            tree = steered_tree(root, members, set(private), seed)
            leader, masking = mask_group(tree, victim)
            if leader != victim and tree != masked_tree(root, members, set(private), GROUP, MIN_GROUP, seed) \
                    and {leader, *masking} - {victim} <= ours and len(masking) >= MIN_GROUP:
                return tree, set(private)
    return None


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalMesh, HostilePeer, dict[int, str], str]]:
    base = tmp_path_factory.mktemp("secagg-groups")
    mesh = LocalMesh(base, 3)
    hostile = None
    try:
        mesh.start(timeout=120)
        mesh.wait_connected(60 * load_factor())
        honest_job = mesh.submit(light_spec(rounds=1000, min_nodes=2, **TIMING, **HONEST_PACE))
        hostile = HostilePeer(base / "hostile", mesh.call(0, "status")["addrs"][0]).start()
        ids = {i: mesh.call(i, "status")["peer_id"] for i in range(3)}
        mesh.wait_until(lambda: set(ids.values()) <= set(hostile.node.peers.alive()), 60 * load_factor(),
                        what="the hostile peer meeting everyone")
        yield mesh, hostile, ids, honest_job
    finally:
        if hostile is not None:
            hostile.close()
        mesh.close()


def test_a_coordinator_cannot_steer_masked_groups_through_the_private_list(world) -> None:
    mesh, h, ids, _ = world
    victim = ids[1]
    sybils = [Identity.generate().peer_id for _ in range(4)]
    members = sorted([h.peer_id, *ids.values(), *sybils])
    ours = {h.peer_id, *sybils}
    spec = digits_spec(rounds=1, min_nodes=2, secure_aggregation=True, group_size=GROUP, secagg_min_group=MIN_GROUP,
                       allowlist=members, **{**TIMING, "train_timeout_s": 20.0})
    found = None
    for created in range(5000):  # a job whose first round the hostile peer coordinates, and can steer
        frame = seal(h.identity, JOB, {"spec": spec, "members": members, "created": created})
        job = open_envelope(frame).digest[:16]
        if coordinator_ranking(job, 1, members)[0] != h.peer_id:
            continue
        found = find_steering(h.peer_id, members, victim, ours, group_seed(job, 1))
        if found is not None:
            break
    assert found is not None, "no job id let the coordinator steer the victim's group"
    tree, private = found
    log = mesh.log_path(1)
    before = len(re.findall(r"chose its own secure-aggregation groups", log.read_text(errors="replace")))
    h.call(h.push_raw, list(ids.values()), frame)
    mesh.wait_until(lambda: any(j["job_id"] == job and j["model_hash"] for j in mesh.call(1, "jobs")),
                    60 * load_factor(), what="the victim preparing the job")
    base = mesh.job(1, job)["model_hash"]
    plan = make_plan(h.identity, job=job, round=1, attempt=0, coordinator=h.peer_id, base_hash=base,
                     prev_result="", members=list(tree), parent=tree, private=sorted(private),
                     train_deadline=time.time() + 40.0, reduce_slack_s=2.0, sample_cap=0)
    h.call(h.push_raw, list(ids.values()), plan)
    mesh.wait_until(lambda: len(re.findall(r"chose its own secure-aggregation groups",
                                           log.read_text(errors="replace"))) > before,
                    60 * load_factor(), what="the victim refusing the steered plan")
    time.sleep(2.0)
    assert not [u for u in h.updates if u.sender == victim], "the victim sent its update into the steered group"


def test_masked_groups_are_drawn_from_nonces_each_member_committed_a_round_before(world) -> None:
    """A masked job of the three honest nodes: every update reveals a nonce and commits to the
    next one, and from round 3 on every plan's groups (and the members' order in them) are the
    ones those nonces give; the previous result's digest, which its root could re-sign at will
    to try seed after seed, is no input. A root can only leave contributions out."""
    mesh, _, ids, _ = world
    honest = sorted(ids.values())
    rounds = 4
    job = mesh.submit(digits_spec(rounds=rounds, min_nodes=3, secure_aggregation=True, group_size=2,
                                  secagg_min_group=2, allowlist=honest, **{**TIMING, "train_timeout_s": 20.0}))
    mesh.wait_job(job, [0, 1, 2], timeout=240 * load_factor())
    ledger = Ledger(mesh.home(0) / "jobs" / job / "ledger.msgpack", job)
    ledger.load()
    results = [parse_result(open_envelope(frame, expect_kind=RESULT)) for frame in ledger.frames]
    assert len(results) == rounds
    for res in results:
        rows = {row["peer"]: row for row in res.contributors}
        assert sorted(rows) == honest, res.round
        assert all(len(row.get("nonce", "")) == 64 and len(row.get("commit", "")) == 64 for row in rows.values())
    for r in range(3, rounds + 1):
        plan = results[r - 1].plan
        seed, placed = group_draw(job, r, results[r - 2].contributors, results[r - 3].contributors)
        assert placed == frozenset(honest), f"round {r}: every member's nonce matched its commitment"
        fair = masked_tree(plan.coordinator, plan.members, plan.private, 2, 2, seed, placed)
        assert list(plan.parent.items()) == list(fair.items()), f"round {r}: groups not drawn from the nonces"
        # The draw stays put whatever the previous root signs: another digest, the same draw.
        assert group_draw(job, r, [dict(row, metrics={"x": 1}) for row in results[r - 2].contributors],
                          results[r - 3].contributors) == (seed, placed)


def test_the_honest_job_kept_one_ledger(world) -> None:
    mesh, _, _, job = world
    assert_one_ledger(mesh, job, (0, 1, 2), at_least=1)
