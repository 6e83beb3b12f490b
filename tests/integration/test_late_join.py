"""A node that joins a mesh after a job ended takes the job's final ledger, and neither fits
the job to its device nor passes coordinator turns for it: there are no rounds left."""

from __future__ import annotations

import time

import pytest

from gpuflex.node.prepare import CATCH_UP_FIRST_AFTER_S
from tests.integration.conftest import light_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_a_late_node_does_not_prepare_a_finished_job(mesh_factory) -> None:
    mesh = mesh_factory(3)
    mesh.start(timeout=120, count=2)
    mesh.wait_connected(60)
    submitted = time.monotonic()
    job = mesh.submit(light_spec(rounds=2, min_nodes=2))
    mesh.wait_job(job, [0, 1], timeout=180)
    # A job younger than this may still be starting on its way to a peer; this one is over.
    time.sleep(max(0.0, CATCH_UP_FIRST_AFTER_S + 1 - (time.monotonic() - submitted)))
    mesh.start_node(2, timeout=120)

    def synced() -> bool:
        jobs = {j["job_id"]: j for j in mesh.call(2, "jobs")}
        return job in jobs and jobs[job]["state"] == "done" and jobs[job]["round"] == 2

    mesh.wait_until(synced, 120, what="the late node taking the finished job's ledger")
    log = mesh.log_path(2).read_text()
    assert f"job {job}: training on" not in log, log
    assert "passes its coordinator turns" not in log, log
