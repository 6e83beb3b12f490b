"""Plug-in patterns allow only the module's own functions, and a job whose code killed its node
is not run again at restart.

Real node processes on loopback: node 1's operator allows ``tests.integration.plugin_lab:*``
(a module that imports ``os``), node 0 allows no plug-in, and an honest built-in job runs on
both throughout.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import pytest

from gpuflex.client import ControlError
from gpuflex.localmesh import LocalMesh
from tests.integration.conftest import HONEST_PACE, digits_spec, light_spec
from tests.integration.honest_job import assert_one_ledger, keeps_committing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
LAB = "tests.integration.plugin_lab"
FAST = {"local_epochs": 1, "plan_timeout_s": 3.0, "train_timeout_s": 12.0, "reduce_timeout_s": 2.0}
#: After a restart, node 1 must still be up this long (it died 4.5 s after each restart before).
STAYS_UP_S = 20.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalMesh, str]]:
    mesh = LocalMesh(tmp_path_factory.mktemp("plugins"), 2,
                     node_args=lambda i: ["--allow-plugin", f"{LAB}:*"] if i == 1 else [])
    try:
        mesh.start(timeout=120)
        mesh.wait_connected(60)
        job = mesh.submit(light_spec(rounds=1000, min_nodes=2, **FAST, **HONEST_PACE))
        keeps_committing(mesh, job, 0)
        yield mesh, job
    finally:
        mesh.close()


def test_a_pattern_does_not_reach_what_the_module_imports(lab: tuple[LocalMesh, str]) -> None:
    """``plugin_lab:*`` is allowed; ``plugin_lab:os.abort`` is a path through an import: refused
    before anything runs, and node 1 stays up."""
    mesh, _ = lab
    with pytest.raises(ControlError, match="does not allow"):
        mesh.call(1, "job_submit", {"spec": digits_spec(model=f"{LAB}:os.abort", min_nodes=1)}, timeout=30)
    time.sleep(3)
    assert mesh.alive(1), "node 1 died"
    assert mesh.call(1, "status")["peer_id"]


def test_a_job_that_killed_its_node_is_not_resumed_at_restart(lab: tuple[LocalMesh, str]) -> None:
    """A plug-in model that aborts kills node 1 once (it is the operator's allowed code); after a
    restart node 1 holds the job back, says why and which file to delete, and stays up, and the
    honest job goes on."""
    mesh, honest = lab
    with contextlib.suppress(ControlError):  # the node may die before it answers
        mesh.call(1, "job_submit", {"spec": digits_spec(model=f"{LAB}:aborting_model", min_nodes=1)}, timeout=30)
    mesh.wait_until(lambda: not mesh.alive(1), 60, what="node 1 running the aborting plug-in")
    assert mesh.procs[1].poll() in (-signal.SIGABRT, 128 + signal.SIGABRT, 134), mesh.procs[1].poll()
    since = mesh.job(0, honest)["round"]
    mesh.start_node(1, timeout=120)
    start = time.time()
    while time.time() - start < STAYS_UP_S:
        assert mesh.alive(1), f"node 1 died again {time.time() - start:.1f} s after its restart"
        time.sleep(0.5)
    log = mesh.log_path(1).read_text(errors="replace")
    assert "not resumed (delete" in log and "plugin_running" in log, log[-2000:]
    keeps_committing(mesh, honest, since)


def test_the_honest_job_kept_one_ledger(lab: tuple[LocalMesh, str]) -> None:
    mesh, job = lab
    assert_one_ledger(mesh, job, (0, 1), at_least=2)
