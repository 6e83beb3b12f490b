"""Secure aggregation with real node processes: a member that dies right after masking is
recovered from the survivors' seed shares, and too many dropouts fail the group, never the sum.

The dropout is scripted by the test harness (``tests.integration.dropout_node``, which installs
the fault through ``gpuflex.node.faults`` before running the ordinary CLI): the member exits
with SIGKILL after its partners' masks already include it and before its update is sent, a
point an outside kill cannot hit reliably. The committed model is checked against the
survivors' deltas recomputed here, which are deterministic given the job's seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.messages import PLAN, RESULT, parse_plan
from gpuflex.node.core.modelblob import unpack_model
from mesh.codec import open_envelope
from tests.integration.conftest import digits_spec
from tests.integration.dropout_node import DROP_ENV
from tests.integration.test_faults import FAST, ledger_frames, peer_ids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
# One group: with group_size above the mesh size the root leads everyone, so the four other
# nodes mask (g = 4, default threshold 2: one dropout can be recovered, two cannot).
# A long plan timeout keeps a slow first-ranked coordinator from being overtaken by a backup on
# a loaded machine: the test needs the one plan whose group it scripted the dropout for.
SECAGG = {**FAST, "secure_aggregation": True, "group_size": 8, "min_nodes": 2, "strategy": "fedavg",
          "server_lr": 1.0, "plan_timeout_s": 10.0}


def start(mesh_factory: Any, drop: str, **spec: Any) -> tuple[LocalMesh, dict[str, int], str]:
    root = str(Path(__file__).resolve().parents[2])  # where the harness module imports from
    mesh = mesh_factory(5, env={DROP_ENV: drop, "PYTHONPATH": root}, launcher=("-m", "tests.integration.dropout_node"))
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    ids = peer_ids(mesh, range(5))
    return mesh, ids, mesh.submit(digits_spec(rounds=1, **{**SECAGG, **spec}))


def wait_dead(mesh: LocalMesh, count: int) -> list[int]:
    mesh.wait_until(lambda: sum(not mesh.alive(i) for i in range(5)) >= count, 180, interval=0.2,
                    what=f"{count} scripted dropout(s)")
    return [i for i in range(5) if not mesh.alive(i)]


def first_result(mesh: LocalMesh, node: int, job: str) -> dict[str, Any]:
    frames = ledger_frames(mesh, node, job)
    assert len(frames) == 1
    return dict(open_envelope(frames[0], expect_kind=RESULT).body)


def retrained(mesh: LocalMesh, node: int, job: str, peers: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Round 1's base and each peer's delta, trained again here on the peer's part of the data."""
    from gpuflex.jobspec import JobSpec
    from gpuflex.ml.workload import Workload

    body = open_envelope((mesh.home(node) / "jobs" / job / "job.frame").read_bytes()).body
    spec = JobSpec.from_dict(body["spec"])
    members = sorted(set(body["members"]))
    base, deltas = np.zeros(0, np.float32), {}
    for peer in peers:
        work = Workload(spec, members.index(peer), len(members), home=mesh.home(node))
        base = work.initial_params()
        deltas[peer] = work.train(base)[0]
    return base, deltas


def fedavg(base: np.ndarray, deltas: dict[str, np.ndarray], samples: dict[str, int]) -> np.ndarray:
    """One FedAvg step with server_lr 1 over the sample-weighted mean of ``samples``' peers."""
    mean = np.average([deltas[p] for p in samples], axis=0, weights=[samples[p] for p in samples])
    return base + mean.astype(np.float32)


def committed_model(mesh: LocalMesh, node: int, res: dict[str, Any]) -> np.ndarray:
    return unpack_model((mesh.home(node) / "blobs" / res["model_hash"]).read_bytes())[0]


def test_member_dropping_after_masking_is_recovered_from_the_survivors_shares(mesh_factory) -> None:
    mesh, ids, job = start(mesh_factory, "1:0")
    (victim,) = wait_dead(mesh, 1)
    alive = [i for i in range(5) if i != victim]
    mesh.wait_job(job, alive, timeout=240)

    res = first_result(mesh, alive[0], job)
    plan = parse_plan(open_envelope(res["plan"], expect_kind=PLAN))
    root, names = plan.coordinator, {i: p for p, i in ids.items()}
    assert set(plan.members) == set(ids) and all(plan.parent[m] == root for m in ids if m != root)
    masking = sorted(set(ids) - {root})
    assert names[victim] == masking[0], "the scripted dropout is the first member of the sorted group"
    assert res["attempt"] == 0, "recovery must save the first attempt"
    assert res["absent"] == [names[victim]]
    contributors = {c["peer"]: c["samples"] for c in res["contributors"]}
    assert set(contributors) == set(ids) - {names[victim]}
    assert res["secagg"] == [{"leader": root, "attempt": 0, "survivors": masking[1:], "dropped": [names[victim]],
                              "recovered": True, "reason": ""}]
    log = mesh.log_path(ids[root]).read_text(errors="replace")
    assert "unmasked the sum of 3 survivors after 1 member(s) dropped" in log

    model = committed_model(mesh, alive[0], res)
    base, deltas = retrained(mesh, alive[0], job, sorted(contributors))
    # quantisation (2^-14 per coordinate) is the only difference from the plain sum
    assert float(np.max(np.abs(model - fedavg(base, deltas, contributors)))) < 2e-4
    without_one = {p: n for p, n in contributors.items() if p != masking[1]}
    assert float(np.max(np.abs(model - fedavg(base, deltas, without_one)))) > 1e-2, \
        "the check must tell a missing survivor apart"


def test_too_many_dropouts_fail_the_group_clearly_and_the_round_is_retried(mesh_factory) -> None:
    # Three survivors can retry only as a root and a masked group of two, which this job allows
    # (the default minimum of three masked members would leave the round waiting for a fourth).
    mesh, ids, job = start(mesh_factory, "1:0,1", secagg_min_group=2)
    victims = wait_dead(mesh, 2)
    alive = [i for i in range(5) if i not in victims]
    mesh.wait_job(job, alive, timeout=300)
    names = {i: p for p, i in ids.items()}
    dead = {names[i] for i in victims}

    res = first_result(mesh, alive[0], job)
    assert res["attempt"] >= 1, "attempt 0 cannot commit: its masked sum is unrecoverable"
    contributors = {c["peer"]: c["samples"] for c in res["contributors"]}
    assert not dead & set(contributors)
    failed = [r for r in res["secagg"] if not r["recovered"]]
    assert failed and failed[0]["attempt"] == 0 and set(failed[0]["dropped"]) == dead
    assert "2 of 4 masked members dropped; with threshold 2 at most 1 can be recovered" in failed[0]["reason"]
    assert res["secagg"][-1]["recovered"] and res["secagg"][-1]["attempt"] == res["attempt"]
    root0 = failed[0]["leader"]
    log = mesh.log_path(ids[root0]).read_text(errors="replace")
    assert "secure aggregation could not recover the group sum" in log
    assert "did not commit" in mesh.log_path(alive[0]).read_text(errors="replace")

    # the retried round is exactly the mean of who contributed to it
    base, deltas = retrained(mesh, alive[0], job, sorted(contributors))
    assert float(np.max(np.abs(committed_model(mesh, alive[0], res) - fedavg(base, deltas, contributors)))) < 2e-4
