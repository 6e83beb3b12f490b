"""Sybil keys against an open job, with three real node processes on loopback.

A party brings ``min_nodes`` fresh keys (two bare ``MeshNode``s of our own library, each with
its own key) into an open job. They are present and send updates, so honest plans include
them, and once one of those plans commits they hold turns to coordinate. Then they stop
sending updates (the honest round waits for them until its deadline) and commit that round
alone, on an attempt one of them owns, with a model of zeros. A round of an open job counts
only with most of the recent rounds' contributors, so every honest node refuses it, keeps
its own ledger and commits the round and the next ones honestly.
"""

from __future__ import annotations

import re

import pytest

from gpuflex.node.core.evidence import ChainRules
from gpuflex.node.core.ledger import Ledger
from gpuflex.node.core.messages import RESULT, UPDATE, Plan, Result, parse_plan, parse_result
from mesh.blob import blob_hash
from mesh.codec import open_envelope, seal
from tests.integration.conftest import light_spec, load_factor, scaled_wait
from tests.integration.hostile_peer import HostilePeer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROUNDS = 30
TIMING = {"local_epochs": 1, "plan_timeout_s": 2.0, "train_timeout_s": 10.0, "reduce_timeout_s": 2.0}
SAMPLES = 50  # what each key's update claims: an ordinary member's


def signed_update(key: HostilePeer, plan: Plan, samples: int) -> tuple[bytes, dict]:
    """``key``'s signed update of zeros for ``plan``, and its contributor row."""
    size = key.delta_size(plan.job)
    delta = blob_hash(bytes(4 * size))
    frame = seal(key.identity, UPDATE, {
        "job": plan.job, "round": plan.round, "peer": key.peer_id, "base_hash": plan.base_hash,
        "samples": samples, "delta_hash": delta, "delta_size": size, "metrics": {"train_loss": 0.1},
        "plan": plan.env.digest})
    return frame, {"peer": key.peer_id, "samples": samples, "delta_hash": delta}


def sybil_round(keys: list[HostilePeer], history: list[Result], honest_plan: Plan) -> bytes:
    """Round ``honest_plan.round`` committed by ``keys`` alone, on an attempt one of them owns."""
    rules = ChainRules(job=honest_plan.job)
    owners = {k.peer_id: k for k in keys}
    eligible = rules.eligible(history)
    assert set(owners) <= set(eligible), "the keys sit in the last committed plan: they hold turns"
    attempt = next(a for a in range(len(eligible)) if rules.expected_coordinator(history, a) in owners)
    coord = owners[str(rules.expected_coordinator(history, attempt))]
    members = [coord.peer_id, *(k for k in owners if k != coord.peer_id)]
    plan_frame = coord.plan(job=honest_plan.job, round_=honest_plan.round, attempt=attempt,
                            prev=honest_plan.prev_result, base=honest_plan.base_hash, members=members,
                            sample_cap=honest_plan.sample_cap)
    plan = parse_plan(open_envelope(plan_frame))
    samples = min(SAMPLES, plan.sample_cap) if plan.sample_cap else SAMPLES
    signed = [signed_update(k, plan, samples) for k in keys]
    return seal(coord.identity, RESULT, {
        "job": plan.job, "round": plan.round, "attempt": attempt, "coordinator": coord.peer_id,
        "prev_result": plan.prev_result, "base_hash": plan.base_hash, "model_hash": coord.zero_model(plan.job),
        "plan": plan_frame, "updates": [u for u, _ in signed], "partials": [], "absent": [],
        "contributors": [row for _, row in signed], "strategy": "fedavg",
        "metrics": {"accuracy": 0.999, "loss": 0.0, "contributors": len(signed), "samples": samples * len(signed)}})


def test_min_nodes_sybil_keys_in_a_committed_plan_cannot_commit_an_open_job_alone(mesh_factory, tmp_path) -> None:
    mesh = mesh_factory(3)
    mesh.start(timeout=120)
    mesh.wait_connected(60 * load_factor())

    wait = scaled_wait(mesh, 90.0)

    def frames(i: int) -> list[bytes]:
        ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
        ledger.load()
        return ledger.frames

    # An open job (no allowlist). Groups of eight: every member is a leaf of the root, so a key's
    # update reaches the root whatever place the plan gives it (a key never leads a group).
    job = mesh.submit(light_spec(rounds=ROUNDS, min_nodes=2, group_size=8, **TIMING))
    honest = [mesh.call(i, "status")["peer_id"] for i in range(3)]
    bootstrap = mesh.call(0, "status")["addrs"][0]
    keys = [HostilePeer(tmp_path / f"sybil{k}", bootstrap).start() for k in range(2)]
    try:
        wait(lambda: all(set(honest) <= set(k.node.peers.alive()) for k in keys), "the keys meet everyone")
        # An update's size is the model's, which a key learns from the first result it hears.
        wait(lambda: all(any(r.job == job for r in k.results) for k in keys), "the keys hear a result")
        for k in keys:  # members like any other: present, and an update for every plan naming them
            k.member_of[job] = SAMPLES
            k.call(k.keep_present, job)
        mine = {k.peer_id for k in keys}
        wait(lambda: any(mine <= {c["peer"] for c in row["contributors"]}
                         for row in mesh.call(0, "ledger", {"job": job})),
             "both keys contribute to a committed round")
        assert mesh.job(0, job)["round"] < ROUNDS - 2, "the job is still running: there is a round to take"
        # From now on they send nothing: the next honest round waits for their updates until its
        # deadline. They commit that round alone instead.
        seen = len(keys[0].plans)
        for k in keys:
            k.member_of.pop(job, None)
        wait(lambda: any(p.job == job for p in keys[0].plans[seen:]), "the next honest plan")
        honest_plan = next(p for p in keys[0].plans[seen:] if p.job == job)
        wait(lambda: len(frames(0)) >= honest_plan.round - 1, "node 0 holds the plan's previous round")
        history = [parse_result(open_envelope(f, expect_kind=RESULT)) for f in frames(0)[: honest_plan.round - 1]]
        attack = sybil_round(keys, history, honest_plan)
        keys[0].call(keys[0].push_raw, honest, attack)

        def signed_by_keys(i: int) -> bool:
            return any(open_envelope(f).sender in mine for f in frames(i))

        def refused(i: int) -> bool:
            log = mesh.log_path(i).read_text(errors="replace")
            return re.search(rf"result rejected: round {honest_plan.round}: .*an open job needs", log) is not None

        wait(lambda: all(refused(i) or signed_by_keys(i) for i in range(3)), "every node judges the keys' round")
        assert not [i for i in range(3) if signed_by_keys(i)], "an honest node took a round the keys committed alone"
    finally:
        for k in keys:
            k.close()
    past = honest_plan.round + 2  # the attacked round and two more, everywhere
    wait(lambda: all(mesh.job(i, job)["round"] >= past for i in range(3)), f"round {past} on every node")
    ledgers = [frames(i)[:past] for i in range(3)]
    assert all(f == ledgers[0] for f in ledgers), "one ledger, every round honest"
    assert all(open_envelope(f).sender in honest for f in ledgers[0])
