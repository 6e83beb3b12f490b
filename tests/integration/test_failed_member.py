"""A job that fails on one node is named by its peers as gone for that reason, and goes on.

Three real node processes on loopback, each with its operator's own copy of the play text
(node.toml ``[data] shakespeare``). The third operator's file is not a play: it has no
``Name:`` turns, so the job's data cannot be built there. That is a reason the job itself
makes impossible on that node, so the job fails there, and only there: its ``job status``
says failed and why. Its presence tells its peers, who leave it out of their plans and name
it in their ``job status`` as gone for that reason (rather than a round retrying for an
update that never comes), and the job commits every round without it (``min_nodes`` = 2).
The reason names the file it could not read, on its own node only: peers read ``<path>``.
"""

from __future__ import annotations

import pytest

from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.ledger import Ledger
from tests.integration.conftest import load_factor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
PLAY = "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n\nALL:\nSpeak, speak.\n\n" * 60
NOT_A_PLAY = "a shopping list, not a play\n" * 60
WHY = "holds no role turns"  # what the data loader says of a text without turns
ROUNDS = 3
SPEC = {"name": "failed-member", "model": "char-gru", "data": "shakespeare", "rounds": ROUNDS, "min_nodes": 2,
        "local_epochs": 1, "local_steps": 2, "batch_size": 16, "plan_timeout_s": 2.0, "train_timeout_s": 10.0,
        "reduce_timeout_s": 2.0}


def test_a_job_failing_on_one_node_is_named_gone_for_its_reason_by_its_peers(tmp_path) -> None:
    for name, body in (("play.txt", PLAY), ("list.txt", NOT_A_PLAY)):
        (tmp_path / name).write_text(body, encoding="utf-8")

    def data(i: int) -> list[str]:
        return ["--no-mdns", "--data", f"shakespeare={tmp_path / ('list.txt' if i == 2 else 'play.txt')}"]

    with LocalMesh(tmp_path / "mesh", 3, node_args=data) as mesh:
        mesh.start(timeout=120)
        mesh.wait_connected(60 * load_factor())
        ids = [mesh.call(i, "status")["peer_id"] for i in range(3)]
        job = mesh.submit(SPEC)
        mesh.wait_until(lambda: mesh.job(2, job)["state"] == "failed", 60 * load_factor(), interval=0.3,
                        what="the job failing on node 2")
        own = mesh.call(2, "job_status", {"job": job})
        assert WHY in own["error"], own["error"]

        def names_node_2(i: int) -> bool:
            gone = mesh.call(i, "job_status", {"job": job})["gone"]
            return any(row["peer"] == ids[2] and WHY in row["reason"] for row in gone)

        mesh.wait_until(lambda: all(names_node_2(i) for i in (0, 1)), 30 * load_factor(), interval=0.3,
                        what="nodes 0 and 1 naming node 2 as gone for its reason")
        assert str(tmp_path) in own["error"], own["error"]
        for i in (0, 1):
            said = [row["reason"] for row in mesh.call(i, "job_status", {"job": job})["gone"]]
            assert said and not any(str(tmp_path) in why for why in said), said
        mesh.wait_job(job, [0, 1], timeout=120 * load_factor())
        for i in (0, 1):
            assert names_node_2(i), "a finished job still names the member it went on without"
            ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
            ledger.load()
            assert len(ledger.results) == ROUNDS
            assert all({c["peer"] for c in res.contributors} == set(ids[:2]) for res in ledger.results)
        assert mesh.job(2, job)["state"] == "failed"
