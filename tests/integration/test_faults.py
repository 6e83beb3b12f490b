"""Fault tolerance with real node processes (on loopback, or in network namespaces the test
makes): nothing committed is ever lost.

What needs real processes stays here: every node killed and restarted from a corrupt file, a
real full disk, and (tests/integration/test_partition.py) a real network partition. How the
round protocol survives a member, leader or coordinator dying, a late joiner and a straggler is
tested in one process under a mock clock (tests/unit/node/test_round_protocol.py); a hostile
peer's frames against real libp2p hosts in tests/integration/test_hostile_wire.py; kills at an
exact protocol point in test_secagg_dropout.py."""

from __future__ import annotations

import errno
import signal
import time
from pathlib import Path

import pytest

from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.ledger import Ledger, verify_chain
from gpuflex.node.core.ledgerfile import read_ledger_file
from tests.integration.conftest import light_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
#: What these tests check is the ledger, not the model: a small MLP, one local epoch.
FAST = {"local_epochs": 1, "plan_timeout_s": 3.0, "train_timeout_s": 12.0, "reduce_timeout_s": 2.0}


def peer_ids(mesh: LocalMesh, nodes: range | list[int]) -> dict[str, int]:
    return {mesh.call(i, "status")["peer_id"]: i for i in nodes}


def ledger_frames(mesh: LocalMesh, i: int, job: str) -> list[bytes]:
    ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
    ledger.load()
    return ledger.frames


def assert_one_ledger(mesh: LocalMesh, nodes: list[int], job: str, rounds: int) -> list[dict]:
    frames = [ledger_frames(mesh, i, job) for i in nodes]
    assert all(f == frames[0] for f in frames), "ledgers differ between nodes"
    results = verify_chain(frames[0], job)
    assert [r.round for r in results] == list(range(1, rounds + 1))
    return mesh.call(nodes[0], "ledger", {"job": job})


def wait_round(mesh: LocalMesh, node: int, job: str, at_least: int, timeout: float = 180) -> None:
    mesh.wait_until(lambda: mesh.job(node, job)["round"] >= at_least, timeout, interval=0.2,
                    what=f"round {at_least} on node {node}")


def test_all_nodes_killed_then_resumed_with_a_corrupt_state_file(mesh_factory) -> None:
    mesh = mesh_factory(3)
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    job = mesh.submit(light_spec(rounds=5, min_nodes=2, **FAST))
    wait_round(mesh, 0, job, 2)
    for i in range(3):
        mesh.kill(i, signal.SIGKILL)

    ledger = mesh.home(1) / "jobs" / job / "ledger.msgpack"
    data = bytearray(ledger.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = b"\xff" * 16
    ledger.write_bytes(bytes(data))

    time.sleep(0.5)
    mesh.start(timeout=120)
    mesh.wait_job(job, [0, 1, 2], timeout=300)
    assert_one_ledger(mesh, [0, 1, 2], job, 5)
    log = mesh.log_path(1).read_text(errors="replace")
    assert "corrupt" in log and "recovering" in log
    hashes = {mesh.job(i, job)["model_hash"] for i in range(3)}
    assert len(hashes) == 1


def fill_up(path: Path) -> None:
    """Write zeros until the file system holding ``path`` is full."""
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as fh:
        for _ in range(1 << 16):  # bounded: 4 GiB at most
            try:
                fh.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return
    raise AssertionError(f"{path} never filled up")


def test_disk_full_is_reported_keeps_the_ledger_and_the_node_catches_up(small_tmpfs, mesh_factory) -> None:
    mesh = mesh_factory(3)
    jobs_dir = small_tmpfs(mesh.home(2) / "jobs", "1m")  # node 2's job state: ledgers and job files
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    job = mesh.submit(light_spec(rounds=6, min_nodes=2, **FAST))
    wait_round(mesh, 2, job, 1)

    filler = jobs_dir / "filler"
    fill_up(filler)
    mesh.wait_until(lambda: "No space left on device" in mesh.job(2, job)["write_error"], 90, interval=0.2,
                    what="the failed ledger write reported")
    ledger = jobs_dir / job / "ledger.msgpack"
    kept = ledger.read_bytes()
    held = mesh.job(2, job)["round"]
    assert len(verify_chain(read_ledger_file(ledger), job)) == held
    wait_round(mesh, 0, job, held + 2, timeout=120)  # the others commit on; node 2 fails to record them
    assert mesh.alive(2) and mesh.call(2, "status")["jobs"][0]["round"] == held
    assert ledger.read_bytes() == kept
    # A job that arrives now cannot be written down either: node 2 says so and stays up.
    second = mesh.submit(light_spec(rounds=1, min_nodes=2, **FAST))
    mesh.wait_job(second, [0, 1], timeout=120)
    assert mesh.alive(2)
    log = mesh.log_path(2).read_text(errors="replace")
    assert "not recorded: [Errno 28]" in log and f"job {second} not taken on: [Errno 28]" in log

    filler.unlink()
    mesh.wait_job(job, [0, 1, 2], timeout=240)
    mesh.wait_job(second, [0, 1, 2], timeout=120)
    assert_one_ledger(mesh, [0, 1, 2], job, 6)
    assert_one_ledger(mesh, [0, 1, 2], second, 1)
    assert mesh.job(2, job)["write_error"] == ""
    assert "the ledger is saved again" in mesh.log_path(2).read_text(errors="replace")
