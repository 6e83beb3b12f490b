"""A hostile peer publishes jobs that name code, paths and pickles, floods jobs, and hides
escapes and markup in their text; real node processes refuse each job in one log line, with a
penalty, never adopt or save it, survive a restart without taking it on, and keep training
their honest job with one ledger.

One mesh of two node processes serves the whole module: the honest job starts first and runs
through every attack; the last test restarts a node and checks the ledgers. The hostile peer is
a bare ``MeshNode`` of our own library in the test process, with its own key, speaking the
protocol correctly: only what it signs is hostile.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.ledger import Ledger, verify_chain
from gpuflex.node.core.messages import JOB
from gpuflex.node.jobs import job_id_of
from mesh.codec import open_envelope, seal
from mesh.identity import Identity
from mesh.node import MeshConfig, MeshNode
from tests.integration.conftest import digits_spec, load_factor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
HOSTILE = Identity.generate()
ROUNDS = 12
#: Terminal escapes (clear screen, bell, a title change), Rich markup and mathtext.
NASTY_NAME = "[/evil][bold red]x\x1b[2J\x07\x1b]0;owned\x07$\\x$"


class Marker:
    """Unpickling this creates ``path``: proof that a node unpickled the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


@dataclass
class Scene:
    mesh: LocalMesh
    base: Path
    honest: str
    refused: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    base = tmp_path_factory.mktemp("hostile-jobs")
    mesh = LocalMesh(base, 2, extra_args=["--no-mdns", "--max-jobs-per-publisher", "1"])
    try:
        mesh.start(timeout=120)
        mesh.wait_connected(60 * load_factor())
        honest = mesh.submit(digits_spec(rounds=ROUNDS, local_epochs=0, local_steps=5, name="honest"))
        yield Scene(mesh, base, honest)
    finally:
        mesh.close()


@asynccontextmanager
async def hostile_peer(scene: Scene) -> AsyncIterator[MeshNode]:
    assert_up(scene)
    addrs = [await trio.to_thread.run_sync(scene.mesh.call, i, "status") for i in range(2)]
    cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=[a["addrs"][0] for a in addrs],
                     data_dir=scene.base / f"hostile-{time.monotonic_ns()}", mdns=False)
    async with MeshNode.start(HOSTILE, cfg) as node:
        yield node
        node.stop()


def node_ids(scene: Scene) -> list[str]:
    return [scene.mesh.call(i, "status")["peer_id"] for i in range(2)]


async def publish(node: MeshNode, scene: Scene, spec: dict[str, Any], members: list[str] | None = None) -> str:
    """Sign a job frame with the hostile key and hand it to both nodes; its job id."""
    ids = await trio.to_thread.run_sync(node_ids, scene)
    frame = seal(node.identity, JOB, {"spec": spec, "members": members or [node.peer_id, *ids],
                                      "created": time.time()})
    for peer in ids:
        with trio.fail_after(30):
            await node.request(peer, frame)
    return job_id_of(open_envelope(frame))


def refusal_lines(scene: Scene, i: int, job: str) -> list[str]:
    log = scene.mesh.log_path(i).read_text(errors="replace")
    return [line for line in log.splitlines() if f"job {job}" in line and "not taken on" in line]


def assert_up(scene: Scene, *nodes: int) -> None:
    """Each node process is alive; else its exit code and the end of its log."""
    for i in nodes or range(2):
        proc = scene.mesh.procs.get(i)
        if proc is None or proc.poll() is not None:
            tail = scene.mesh.log_path(i).read_text(errors="replace")[-3000:]
            raise AssertionError(f"node {i} is not running (exit {proc and proc.poll()}):\n{tail}")


def refused_here(scene: Scene, i: int, job: str) -> bool:
    return bool(refusal_lines(scene, i, job))


def hostile_penalty(scene: Scene, i: int) -> float:
    rows = [p for p in scene.mesh.call(i, "peers") if p["peer_id"] == HOSTILE.peer_id]
    return float(rows[0]["penalty"]) if rows else 0.0


def check_refused(scene: Scene, job: str, why: str, penalised: bool = True) -> None:
    """On both nodes: alive, one refusal line naming ``why`` (and the publisher's new penalty
    when ``penalised``), no job adopted or saved."""
    mesh = scene.mesh
    for i in range(2):
        mesh.wait_until(partial(refused_here, scene, i, job), 30 * load_factor(), interval=0.2,
                        what=f"node {i} refusing job {job}")
        lines = refusal_lines(scene, i, job)
        assert len(lines) == 1 and why in lines[0], lines
        assert ("; penalty now " in lines[0]) == penalised, lines
        if penalised:
            assert hostile_penalty(scene, i) > 0
        assert_up(scene, i)
        assert job not in {j["job_id"] for j in mesh.call(i, "jobs")}
        assert not (mesh.home(i) / "jobs" / job).exists()
    scene.refused.append(job)


async def test_jobs_naming_code_paths_or_pickles_are_refused_and_the_nodes_stay_up(scene: Scene) -> None:
    pickled = scene.base / "cifar-evil"
    pickled.mkdir()
    marker = scene.base / "unpickled"
    (pickled / "data_batch_1").write_bytes(pickle.dumps({b"data": Marker(marker), b"labels": []}))
    attacks: list[tuple[dict[str, Any], str]] = [
        ({"model": "os:abort", "data": "sklearn-digits"}, "model 'os:abort' is a plug-in this node does not allow"),
        ({"model": "digits-cnn", "data": "sklearn-digits", "rule": "builtins:exec"}, "rule 'builtins:exec'"),
        ({"model": "char-gru", "data": "shakespeare", "data_path": "/dev/zero"}, "data_path"),
        ({"model": "cifar10-cnn", "data": "cifar10", "data_path": str(pickled)}, "data_path"),
        ({"model": "cifar10-cnn", "data": "cifar10"}, "data 'cifar10' is not on this node"),  # no penalty
        ({"model": "digits-cnn", "data": "sklearn-digits", "rounds": 2**63 - 1, "name": "x" * 100_000}, "invalid spec"),
    ]
    async with hostile_peer(scene) as node:
        for spec, why in attacks:
            job = await publish(node, scene, spec)
            await trio.to_thread.run_sync(check_refused, scene, job, why, "not on this node" not in why)
    assert not marker.exists()


async def test_a_flood_is_capped_per_publisher_and_hostile_text_stays_text(scene: Scene) -> None:
    small = {"model": "digits-cnn", "data": "sklearn-digits", "rounds": 1, "local_epochs": 0, "local_steps": 2,
             "name": NASTY_NAME}
    async with hostile_peer(scene) as node:
        first = await publish(node, scene, small)
        flood = [await publish(node, scene, {**small, "seed": n}) for n in range(1, 4)]
        for job in flood:
            await trio.to_thread.run_sync(check_refused, scene, job, "already has 1 unfinished jobs")
    mesh = scene.mesh
    for i in range(2):  # the first is a valid job of built-ins: taken on, with its name as text
        assert first in {j["job_id"] for j in mesh.call(i, "jobs")}
    shown = {}
    for args in (["job", "list"], ["job", "status", first, "--spec"], ["status"]):
        out = subprocess.run([sys.executable, "-m", "gpuflex", *args, "--home", str(mesh.home(0))],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout
        shown[args[-1]] = out.stdout
    assert "[/evil][bold red]x\\x1b[2J\\x07" in shown["list"]  # escaped, not obeyed
    status = mesh.job(0, first)
    assert status["spec"]["name"] == NASTY_NAME and status["spec"]["model"] == "digits-cnn"
    for i in range(2):
        assert "\x1b" not in mesh.log_path(i).read_text(errors="replace")


async def test_a_restart_takes_on_no_refused_job_and_the_honest_job_ends_with_one_ledger(scene: Scene) -> None:
    mesh = scene.mesh
    # A hostile job that an older version saved: judged again at start, refused, file kept.
    frame = seal(HOSTILE, JOB, {"spec": {"model": "os:abort", "data": "sklearn-digits"},
                                "members": [HOSTILE.peer_id], "created": time.time()})
    planted = job_id_of(open_envelope(frame))
    assert_up(scene)
    (mesh.home(1) / "jobs" / planted).mkdir(parents=True)
    (mesh.home(1) / "jobs" / planted / "job.frame").write_bytes(frame)

    mesh.call(1, "shutdown")  # the honest job usually still runs here (12 short rounds)
    mesh.procs[1].wait(timeout=30)
    await trio.to_thread.run_sync(lambda: mesh.start_node(1, timeout=120))
    await trio.to_thread.run_sync(
        lambda: mesh.wait_until(partial(refused_here, scene, 1, planted), 30, what="refusal at start"))
    assert "os:abort" in refusal_lines(scene, 1, planted)[-1]
    jobs = {j["job_id"] for j in mesh.call(1, "jobs")}
    assert scene.honest in jobs and planted not in jobs and not jobs & set(scene.refused)
    assert (mesh.home(1) / "jobs" / planted / "job.frame").exists()

    await trio.to_thread.run_sync(lambda: mesh.wait_job(scene.honest, [0, 1], timeout=180 * load_factor()))
    frames = []
    assert_up(scene)
    for i in range(2):
        ledger = Ledger(mesh.home(i) / "jobs" / scene.honest / "ledger.msgpack", scene.honest)
        assert ledger.load() == []
        verify_chain(ledger.frames, scene.honest)
        frames.append(ledger.frames)
        assert not any((mesh.home(i) / "jobs" / job).exists() for job in scene.refused)
    assert len(frames[0]) == ROUNDS and frames[0] == frames[1]
