"""A hostile peer against three real node processes on loopback, while they train one job.

The peer is a bare ``MeshNode`` of our own library with its own key (``hostile_peer``). One
mesh is shared by every attack, in order; the honest job runs through all of them, and its
ledgers are checked at the end: one ledger on every node, every round with its evidence, no
round of the hostile peer's. A second, short honest job submitted beside it has finished by
then: its final ledger and model are attacked last, and must not change.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.ledger import Ledger, verify_chain
from gpuflex.node.core.messages import JOB, PRESENCE, RESULT, parse_result
from gpuflex.node.core.ranking import coordinator_ranking
from mesh.codec import open_envelope, seal
from tests.integration.conftest import digits_spec, load_factor
from tests.integration.hostile_peer import HostilePeer, ground, old_digest, re_encodings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROUNDS = 24  # rounds of 0.5 s (idle) to 5 s (loaded): the job runs through every attack on it
SHORT_ROUNDS = 3  # the job that has finished when the last attack comes
TIMING = {"local_epochs": 1, "plan_timeout_s": 2.0, "train_timeout_s": 10.0, "reduce_timeout_s": 2.0}
HUGE = 10**12


class Arena:
    """Three honest nodes training one job, and the hostile peer beside them."""

    def __init__(self, mesh: LocalMesh, job: str, hostile: HostilePeer, ids: dict[int, str], short: str) -> None:
        self.mesh, self.job, self.hostile, self.ids, self.short = mesh, job, hostile, ids, short

    def wait(self, predicate: Any, what: str, timeout: float = 60.0) -> None:
        def holds() -> bool:
            self.hostile.check_running()  # a wait on a peer that has stopped would only time out
            return bool(predicate())

        self.mesh.wait_until(holds, timeout * load_factor(), interval=0.2, what=what)

    def committed(self, i: int = 0) -> int:
        return int(self.mesh.job(i, self.job)["round"])

    def wait_round(self, at_least: int) -> None:
        self.wait(lambda: min(self.committed(i) for i in range(3)) >= at_least, f"round {at_least} everywhere")

    def frames(self, i: int, job: str | None = None) -> list[bytes]:
        ledger = Ledger(self.mesh.home(i) / "jobs" / (job or self.job) / "ledger.msgpack", job or self.job)
        ledger.load()
        return ledger.frames

    def head(self, job: str | None = None) -> tuple[int, Any]:
        """(round, result) at the head of node 0's ledger."""
        frames = self.frames(0, job)
        return len(frames), parse_result(open_envelope(frames[-1], expect_kind=RESULT))

    def log(self, i: int) -> str:
        return self.mesh.log_path(i).read_text(errors="replace")

    def logged(self, pattern: str, nodes: range | list[int] = range(3)) -> bool:
        return all(re.search(pattern, self.log(i)) for i in nodes)

    def no_hostile_round(self, job: str | None = None) -> None:
        for i in range(3):
            assert all(open_envelope(f).sender != self.hostile.peer_id for f in self.frames(i, job)), \
                f"node {i} committed a round signed by the hostile peer"


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Arena]:
    base = tmp_path_factory.mktemp("hostile")
    mesh = LocalMesh(base, 3)
    hostile = None
    try:
        mesh.start(timeout=120)
        mesh.wait_connected(60 * load_factor())
        job = mesh.submit(digits_spec(rounds=ROUNDS, min_nodes=2, **TIMING))
        short = mesh.submit(digits_spec(rounds=SHORT_ROUNDS, min_nodes=2, **TIMING), node=1)
        hostile = HostilePeer(base / "hostile", mesh.call(0, "status")["addrs"][0]).start()
        ids = {i: mesh.call(i, "status")["peer_id"] for i in range(3)}
        arena = Arena(mesh, job, hostile, ids, short)
        arena.wait(lambda: set(ids.values()) <= set(hostile.node.peers.alive()), "the hostile peer meets everyone")
        # It takes part in the job from now on: present, and sending updates of zeros that
        # claim 10^12 samples whenever a plan names it.
        hostile.member_of[job] = HUGE
        hostile.call(hostile.keep_present, job)
        yield arena
    finally:
        if hostile is not None:
            hostile.close()
        mesh.close()


def test_a_forged_result_with_no_updates_is_rejected_in_a_running_job(arena: Arena) -> None:
    h, job = arena.hostile, arena.job
    arena.wait_round(1)
    arena.wait(lambda: any(r.job == job for r in h.results), "the hostile peer hears a result")
    n, head = arena.head()
    members = list(arena.ids.values())
    zero = h.zero_model(job)
    # A competing round n on the same parent, nonces ground until its digest beats the honest one.
    rival = ground(lambda: h.forged_result(job=job, round_=n, attempt=0, prev=head.prev_result,
                                           base=head.base_hash, model=zero, members=members),
                   min(head.digest, old_digest(head.env.raw)))
    h.sync_ledgers = {job: [*arena.frames(0)[: n - 1], rival]}
    # Straight to every node (gossip relays are rate-limited per origin, and this peer has
    # been sending presence every second).
    h.call(h.push_raw, members, rival)
    # The next round, claiming 99 contributors with no update at all, and a huge attempt.
    h.call(h.push_raw, members, h.forged_result(job=job, round_=n + 1, attempt=2**31 - 2, prev=head.digest,
                                                base=head.model_hash, model=zero, members=members))
    refused = rf"result rejected: round {n + 1}: .*(belongs to|verified contributions|caps samples)"
    arena.wait(lambda: arena.logged(refused),
               "every node rejects the forged next round")
    arena.wait_round(n + 1)
    arena.no_hostile_round()


def test_a_presence_claiming_round_99_and_a_ledger_without_evidence_switch_nobody(arena: Arena, tmp_path) -> None:
    h, job = arena.hostile, arena.job
    arena.wait(lambda: any(r.job == job for r in h.results), "the hostile peer hears a result")
    # A claimant of its own, so that no earlier attack's fruitless sync throttles the ask
    # (``FRUITLESS_SYNC_S``): each node that hears this claim must take it up.
    claimant = HostilePeer(tmp_path / "claimant", arena.mesh.call(0, "status")["addrs"][0]).start()
    honest = list(arena.ids.values())
    try:
        arena.wait(lambda: set(honest) <= set(claimant.node.peers.alive()), "the claimant meets everyone")
        first = parse_result(open_envelope(arena.frames(0)[0], expect_kind=RESULT))
        claimant.sync_ledgers = {job: claimant.forged_chain(job=job, rounds=99, base=first.base_hash,
                                                            model=h.zero_model(job), members=honest,
                                                            beat=min(first.digest, old_digest(first.env.raw)))}
        claimant.sync_weights = {job: HUGE}

        def heard_and_refused(i: int) -> bool:
            return re.search(rf"rejected input from {claimant.peer_id[-8:]} \(sync page of job {job}\): "
                             r"evidence: ledger from \w+: round 1: .*penalty now", arena.log(i)) is not None

        # Straight to every node, freshly signed (gossip drops a copy it has seen), again until
        # each has judged it: a node catching up from another peer at that moment takes the
        # claim up from the next presence.
        for _ in range(60):
            claimant.call(claimant.push_raw, honest, seal(claimant.identity, PRESENCE,
                                                          {"jobs": {job: 99}, "weights": {job: HUGE}}))
            if all(heard_and_refused(i) for i in range(3)):
                break
            time.sleep(0.5 * load_factor())
        missing = [i for i in range(3) if not heard_and_refused(i)]
        assert not missing, f"nodes {missing} heard the claim and did not fetch, check and penalise its ledger"
        for i in range(3):  # every node that heard the claim holds the claimant's penalty
            row = next(r for r in arena.mesh.call(i, "peers") if r["peer_id"] == claimant.peer_id)
            assert row["penalty"] > 0, f"node {i} did not penalise the claimant"
    finally:
        claimant.close()
    assert not any("switched to the winning branch" in arena.log(i) for i in range(3))
    assert all(arena.committed(i) < 99 for i in range(3))
    for i in range(3):
        assert all(open_envelope(f).sender != claimant.peer_id for f in arena.frames(i)), \
            f"node {i} took a round of the claimed branch"
    arena.no_hostile_round()


def test_plans_from_the_wrong_coordinator_or_with_huge_deadlines_are_rejected(arena: Arena) -> None:
    from mesh.identity import Identity

    h, mesh = arena.hostile, arena.mesh
    honest = sorted(arena.ids.values())
    # A plan is judged only while its round is open here. The round is held open on purpose:
    # a job of four named members with min_nodes=4, one of which (``absent``, a key the hostile
    # peer holds) never comes up, so its round 1 waits for as long as the test takes. The
    # hostile peer is no member of it; ``absent`` owns some of its attempts.
    absent = Identity.generate()
    members = sorted([*honest, absent.peer_id])
    spec = digits_spec(rounds=1, min_nodes=4, **TIMING)
    frame = seal(h.identity, JOB, {"spec": spec, "members": members, "created": 0})
    job = open_envelope(frame).digest[:16]
    before = {i: len(arena.frames(i)) for i in range(3)}
    h.call(h.push_raw, honest, frame)
    arena.wait(lambda: all(any(j["job_id"] == job and j["model_hash"] for j in mesh.call(i, "jobs")) for i in range(3)),
               "every node prepares the job")
    base = mesh.job(0, job)["model_hash"]
    owner = {a: coordinator_ranking(job, 1, members, [], a)[0] for a in range(len(members))}
    common = {"job": job, "round_": 1, "prev": "", "base": base, "members": [*members, h.peer_id]}
    # An attempt the ranking gives to someone else (every one: the hostile peer is no member),
    # and, signed by the member whose attempt it is, a plan with a deadline 11 days out.
    h.call(h.push_raw, honest, h.plan(attempt=0, **common))
    h.call(h.push_raw, honest, h.plan(attempt=next(a for a, p in owner.items() if p == absent.peer_id),
                                      identity=absent, train_in_s=1e6, **common))
    # Each node logs the rejection and penalises the peer that handed it the plan (the hostile
    # peer, or a node that relayed the plan to it).
    rejected = r"rejected input from \w+ \([^)]*\): round: "
    arena.wait(lambda: arena.logged(rf"{rejected}plan from {h.peer_id[-8:]} for attempt 0, "
                                    rf"which belongs to {owner[0][-8:]}; penalty now"),
               "every node rejects the wrong coordinator's plan")
    arena.wait(lambda: arena.logged(rf"{rejected}the plan's training deadline is \d+s away; the job allows \d+s; "
                                    r"penalty now"), "every node rejects the 11-day deadline")
    for i in range(3):
        log = arena.log(i)
        for signer in (h.peer_id, absent.peer_id):
            assert not re.search(rf"plan from {signer[-8:]} for attempt \d+ with", log), \
                f"node {i} put a plan of {signer[-8:]} in force"
        assert mesh.job(i, job)["round"] == 0 and arena.frames(i, job) == [], f"node {i} committed the held round"
    # The job trained beside it keeps one ledger, and no round of the hostile peer's.
    frames = [arena.frames(i) for i in range(3)]
    shortest = min(len(f) for f in frames)
    assert shortest >= min(before.values())
    assert all(f[:shortest] == frames[0][:shortest] for f in frames), "nodes hold different ledgers"
    arena.no_hostile_round()


def test_a_re_encoded_result_has_no_second_id_and_changes_no_fork_choice(arena: Arena) -> None:
    h, job = arena.hostile, arena.job
    arena.wait_round(3)
    honest = arena.frames(0)
    n = len(honest)
    # The same signed result, its outer msgpack array re-encoded (no key needed), picked so that
    # a digest of the whole frame would beat the honest one in fork choice. A round's frame is
    # the smallest of its encodings once in 18: take the first round where it is not.
    k, copy = next((k, c) for k, c in ((k, min(re_encodings(f), key=old_digest)) for k, f in enumerate(honest))
                   if old_digest(c) < old_digest(honest[k]))
    h.sync_ledgers, h.sync_heights = {job: [*honest[:k], copy]}, {job: n + 1}
    h.call(h.push_raw, list(arena.ids.values()), copy)
    h.call(h.presence, {job: n + 1})  # a claim to be ahead, so catch-up sync asks for it too
    arena.wait(lambda: arena.logged(r"canonical encoding"), "every node drops the copy")
    time.sleep(2.0)
    for i in range(3):
        frames = arena.frames(i)
        assert frames[:n] == honest, f"node {i} replaced a round with its re-encoded copy"
        assert "switched to the winning branch" not in arena.log(i)


def test_a_member_claiming_10_to_the_12_samples_weighs_at_most_the_cap(arena: Arena) -> None:
    h, job = arena.hostile, arena.job
    rows: list[dict] = []

    def counted(row: dict) -> bool:
        return row["round"] >= 2 and any(c["peer"] == h.peer_id for c in row["contributors"])

    def hostile_counted() -> bool:  # after round 1, whose cap is its coordinator's own count
        rows[:] = arena.mesh.call(0, "ledger", {"job": job})
        return any(counted(r) for r in rows)

    arena.wait(hostile_counted, "a round that counts the hostile member's update", timeout=90)
    row = next(r for r in rows if counted(r))
    weights = {c["peer"]: c["samples"] for c in row["contributors"]}
    prev = rows[row["round"] - 2]
    median = sorted(c["samples"] for c in prev["contributors"])[len(prev["contributors"]) // 2]
    assert weights[h.peer_id] <= 4 * median < HUGE, weights
    assert row["metrics"]["samples"] == sum(weights.values())


def test_a_peer_the_allowlist_excludes_cannot_coordinate_even_if_the_job_names_it(arena: Arena) -> None:
    h, mesh = arena.hostile, arena.mesh
    honest = sorted(arena.ids.values())
    # A job whose member list names the hostile peer, but whose allowlist does not: it must
    # never coordinate it, whatever the ranking over the named members says.
    # Twenty local epochs keep round 1 open for seconds, so the forged plans meet it uncommitted.
    spec = digits_spec(rounds=1, min_nodes=2, allowlist=honest, **{**TIMING, "local_epochs": 20})
    members = sorted([h.peer_id, *honest])
    for created in range(1000):
        frame = seal(h.identity, JOB, {"spec": spec, "members": members, "created": created})
        job = open_envelope(frame).digest[:16]
        if coordinator_ranking(job, 1, members)[0] == h.peer_id:
            break
    before = [len(re.findall(r"which belongs to", arena.log(i))) for i in range(3)]
    h.call(h.push_raw, list(arena.ids.values()), frame)
    arena.wait(lambda: all(any(j["job_id"] == job and j["model_hash"] for j in mesh.call(i, "jobs")) for i in range(3)),
               "every node prepares the job")
    base = mesh.job(0, job)["model_hash"]
    for attempt in range(3):
        h.call(h.push_raw, list(arena.ids.values()),
               h.plan(job=job, round_=1, attempt=attempt, prev="", base=base, members=members))
    arena.wait(lambda: all(len(re.findall(r"which belongs to", arena.log(i))) > before[i] for i in range(3)),
               "every node refuses the excluded peer's plan")
    arena.wait(lambda: all(mesh.job(i, job)["state"] == "done" for i in range(3)), "the allowlisted job finishes")
    assert not [u for u in h.updates if u.body.get("job") == job], "an honest member trained for the excluded peer"
    for i in range(3):
        assert all(open_envelope(f).sender in honest for f in arena.frames(i, job))


def test_a_coordinator_cannot_choose_secure_aggregation_groups_nor_mask_a_group_of_two(arena: Arena) -> None:
    from mesh.identity import Identity

    h = arena.hostile
    victim = arena.ids[1]
    sybils = [Identity.generate().peer_id for _ in range(2)]
    members = sorted([h.peer_id, victim, sybils[0]])
    spec = digits_spec(rounds=1, min_nodes=2, secure_aggregation=True, group_size=4,
                       allowlist=[h.peer_id, victim, *sybils], **{**TIMING, "train_timeout_s": 20.0})
    for created in range(1000):  # a job id whose first round the hostile peer coordinates
        frame = seal(h.identity, JOB, {"spec": spec, "members": members, "created": created})
        job = open_envelope(frame).digest[:16]
        if coordinator_ranking(job, 1, members)[0] == h.peer_id:
            break
    h.call(h.push_raw, list(arena.ids.values()), frame)
    arena.wait(lambda: any(j["job_id"] == job and j["model_hash"] for j in arena.mesh.call(1, "jobs")),
               "the victim prepares the job")
    base = arena.mesh.job(1, job)["model_hash"]
    # Plan A: the victim alone under the hostile leader (one Sybil leads the other), so its
    # "masked" update would be its update in clear.
    alone = {h.peer_id: None, sybils[0]: h.peer_id, sybils[1]: sybils[0], victim: h.peer_id}
    h.call(h.push_raw, list(arena.ids.values()),
           h.plan(job=job, round_=1, attempt=0, prev="", base=base, members=list(alone), parent=alone))
    arena.wait(lambda: arena.logged(r"chose its own secure-aggregation groups", [1]), "the victim refuses plan A")
    time.sleep(2.0)
    assert not [u for u in h.updates if u.sender == victim], "the victim sent its update to the hostile leader"
    # Plan B: the groups public randomness gives, but only the victim and one Sybil mask.
    from gpuflex.node.core.placement import group_seed, masked_tree

    fair = masked_tree(h.peer_id, members, [], 4, 3, group_seed(job, 1))
    # The victim has moved past attempt 0 by now (nobody planned it): one plan for each of the
    # next attempts the hostile peer owns; the victim holds those ahead until it reaches one.
    for attempt in [a for a in range(48) if coordinator_ranking(job, 1, members, [], a)[0] == h.peer_id]:
        h.call(h.push_raw, list(arena.ids.values()),
               h.plan(job=job, round_=1, attempt=attempt, prev="", base=base, members=list(fair), parent=fair,
                      train_in_s=40.0))
    arena.wait(lambda: arena.logged(r"not sending a masked update: .* fewer than secagg_min_group=3", [1]),
               "the victim refuses to mask into a group of two")
    assert not [u for u in h.updates if u.sender == victim], "the victim sent its update to the hostile leader"


def test_a_finished_jobs_ledger_is_final_and_every_node_holds_the_same_one(arena: Arena) -> None:
    """The short job, finished long before, is attacked with a rival last round and a forged
    heavier chain: nothing changes. The long job, which ran through every attack above, holds
    one ledger on every node, each round with its evidence and none of the hostile peer's."""
    from gpuflex.jobspec import JobSpec
    from gpuflex.node.core.evidence import ChainRules

    h, job, mesh = arena.hostile, arena.short, arena.mesh
    arena.wait(lambda: all(mesh.job(i, job)["state"] == "done" for i in range(3)), "the short job finishes")
    before = [arena.frames(i, job) for i in range(3)]
    status = mesh.job(0, job)
    n, head = arena.head(job)
    zero = h.zero_model(arena.job)  # the same model as the long job's; the short one may have ended unheard
    rival = ground(lambda: h.forged_result(job=job, round_=n, attempt=0, prev=head.prev_result, base=head.base_hash,
                                           model=zero, members=list(arena.ids.values())),
                   min(head.digest, old_digest(head.env.raw)))
    first = parse_result(open_envelope(before[0][0], expect_kind=RESULT))
    h.sync_ledgers = {job: h.forged_chain(job=job, rounds=1, base=first.base_hash, model=zero,
                                          members=list(arena.ids.values()),
                                          beat=min(first.digest, old_digest(first.env.raw)))}
    h.call(h.push_raw, list(arena.ids.values()), rival)
    h.call(h.presence, {job: 99})
    time.sleep(5.0 * load_factor())
    after = [arena.frames(i, job) for i in range(3)]
    assert after == before and len(after[0]) == SHORT_ROUNDS
    assert all(f == after[0] for f in after), "nodes ended on different ledgers"
    again = mesh.job(0, job)
    assert again["model_hash"] == status["model_hash"] and again["metrics"] == status["metrics"]
    results = verify_chain(after[0], job)
    rules = ChainRules.for_job(job, JobSpec.from_dict(digits_spec(rounds=SHORT_ROUNDS, min_nodes=2, **TIMING)),
                               results[0].plan.members, owner=arena.ids[1])  # node 1 submitted it
    verify_chain(after[0], job, rules)  # every round with its evidence, as the nodes check it
    arena.no_hostile_round(job)
    assert results[-1].metrics["accuracy"] > 0.3  # three rounds in: far above chance and the all-zero model's 0.1

    frames = [arena.frames(i) for i in range(3)]  # the long job, still training
    shortest = min(len(f) for f in frames)
    assert shortest >= 3 and all(f[:shortest] == frames[0][:shortest] for f in frames), "nodes hold different ledgers"
    results = verify_chain(frames[0], arena.job)
    rules = ChainRules.for_job(arena.job, JobSpec.from_dict(digits_spec(rounds=ROUNDS, min_nodes=2, **TIMING)),
                               results[0].plan.members, owner=arena.ids[0])  # node 0 submitted it
    verify_chain(frames[0], arena.job, rules)
    arena.no_hostile_round()
