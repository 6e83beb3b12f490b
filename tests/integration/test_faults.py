"""Fault tolerance with real node processes (on loopback, or in network namespaces the test makes): nothing
committed is ever lost."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from gpuflex.localmesh import LocalMesh
from gpuflex.node.ledger import Ledger, read_ledger_file, verify_chain
from tests.integration.conftest import digits_spec
from tests.integration.netns import NetnsPair

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
FAST = {"local_epochs": 4, "plan_timeout_s": 3.0, "train_timeout_s": 12.0, "reduce_timeout_s": 2.0}


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


async def hostile_peer(bootstrap: str, targets: list[str], job: str, data_dir) -> str:
    """Joins the mesh and sends garbage, cut and oversized frames, and a replayed update."""
    from mesh.codec import seal
    from mesh.identity import Identity
    from mesh.messaging import MSG_PROTOCOL, SendError
    from mesh.node import MeshConfig, MeshNode

    cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=[bootstrap], data_dir=data_dir)
    async with MeshNode.start(Identity.generate(), cfg) as node:
        for target in targets:
            for data in (os.urandom(300), (5000).to_bytes(4, "big") + b"cut", (1 << 31).to_bytes(4, "big")):
                with trio.move_on_after(5):
                    try:
                        stream = await node._open(target, MSG_PROTOCOL, 5)
                        await stream.write(data)
                        await stream.close()
                    except Exception:
                        pass
        update = seal(node.identity, "update", {
            "job": job, "round": 1, "peer": node.peer_id, "base_hash": "0" * 64, "samples": 10,
            "delta_hash": "0" * 64, "delta_size": 1, "metrics": {}})
        for _ in range(2):  # an update for a finished round, then the same frame replayed
            with pytest.raises(SendError):
                await node.request(targets[0], update, b"\0\0\0\0", timeout=10)
        node.stop()
        return node.peer_id


def test_member_death_late_joiner_and_hostile_peer(mesh_factory, tmp_path) -> None:
    mesh = mesh_factory(5)
    mesh.start(count=4, timeout=120)
    mesh.wait_connected(60)
    ids = peer_ids(mesh, range(4))
    # Slow rounds (200 local epochs, a few seconds each, as real rounds are) so a joining
    # process, which needs several seconds to start, is up before the round it joins in ends.
    slow = {**FAST, "local_epochs": 200, "train_timeout_s": 60.0}
    job = mesh.submit(digits_spec(rounds=4, min_nodes=2, **slow))

    attack: dict[str, str] = {}
    attacker = threading.Thread(target=lambda: attack.update(hostile=trio.run(
        hostile_peer, mesh.bootstrap, list(ids)[:2], job, tmp_path / "hostile")))
    attacker.start()

    # Round 3: a node joins the mesh while a member dies in its local training.
    wait_round(mesh, 0, job, 2)
    mesh.start_node(4, wait=False)
    training: list[int] = []

    def someone_training() -> bool:  # in round 3: two rounds committed, training the third
        states = {i: mesh.job(i, job) for i in (1, 2, 3)}
        training[:] = [i for i, s in states.items() if s["phase"] == "train" and s["round"] == 2]
        return bool(training)

    mesh.wait_until(someone_training, 120, interval=0.05, what="a member in local training")
    victim = training[0]
    killed_in = mesh.job(victim, job)["round"] + 1
    mesh.kill(victim, signal.SIGKILL)
    survivors = [i for i in (0, 1, 2, 3, 4) if i != victim]
    victim_id = next(p for p, i in ids.items() if i == victim)
    joiner = mesh.wait_api(4, timeout=60)["peer_id"]

    mesh.wait_job(job, survivors, timeout=300)
    rows = assert_one_ledger(mesh, survivors, job, 4)
    assert killed_in == 3, "the member must die before the last round, so later rounds show it gone"
    row = rows[killed_in - 1]
    contributors = {c["peer"] for c in row["contributors"]}
    assert victim_id not in contributors
    assert victim_id in row["absent"] or row["attempt"] > 0
    assert all(victim_id not in {c["peer"] for c in r["contributors"]} for r in rows[killed_in:])
    late = [r["round"] for r in rows if joiner in {c["peer"] for c in r["contributors"]}]
    assert late and min(late) in (3, 4), f"late joiner contributed in rounds {late}"

    attacker.join(timeout=60)
    penalties = {p["peer_id"]: p["penalty"] for p in mesh.call(0, "peers")}
    assert penalties.get(attack["hostile"], 0) > 0


def test_coordinator_and_leader_failover(mesh_factory) -> None:
    mesh = mesh_factory(6)
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    ids = peer_ids(mesh, range(6))
    job = mesh.submit(digits_spec(rounds=5, group_size=2, min_nodes=2, **FAST))

    # Round 2: kill the coordinator right after it has published the plan.
    wait_round(mesh, 0, job, 1)

    def plan_out() -> bool:
        s = mesh.job(0, job)
        return s["round"] == 1 and s["phase"] in ("train", "reduce") and bool(s["tree"])

    mesh.wait_until(plan_out, 60, interval=0.05, what="round 2 plan")
    coordinator = mesh.job(0, job)["coordinator"]
    dead = [ids[coordinator]]
    mesh.kill(dead[0], signal.SIGKILL)
    alive = [i for i in range(6) if i not in dead]
    wait_round(mesh, alive[0], job, 2)

    # Round 4: kill a group leader that is not the root, while its group is training.
    wait_round(mesh, alive[0], job, 3)

    def leader_plan() -> dict | None:
        s = mesh.job(alive[0], job)
        if s["round"] != 3 or not s["tree"] or s["phase"] not in ("train", "reduce"):
            return None
        return s

    mesh.wait_until(lambda: leader_plan() is not None, 60, interval=0.05, what="round 4 plan")
    s = leader_plan() or mesh.job(alive[0], job)
    tree = s["tree"]
    leaders = [p for p in tree if tree[p] is not None and any(v == p for v in tree.values())]
    assert leaders, f"five members in groups of two must give a non-root leader: {tree}"
    leader = leaders[0]
    group = [p for p, parent in tree.items() if parent == leader]

    def leader_reducing() -> bool:  # trained, and collecting its group's updates
        s = mesh.job(ids[leader], job)
        return s["round"] == 3 and s["role"] == "leader" and s["phase"] == "reduce"

    mesh.wait_until(leader_reducing, 60, interval=0.05, what="the leader in the middle of the reduce")
    mesh.kill(ids[leader], signal.SIGKILL)
    dead.append(ids[leader])
    alive = [i for i in range(6) if i not in dead]

    mesh.wait_job(job, alive, timeout=300)
    rows = assert_one_ledger(mesh, alive, job, 5)
    assert rows[1]["coordinator"] != coordinator
    assert all(coordinator not in {c["peer"] for c in r["contributors"]} for r in rows[2:])
    r4 = {c["peer"] for c in rows[3]["contributors"]}
    assert group and set(group) <= r4, "the dead leader's members lost their updates"


def test_all_nodes_killed_then_resumed_with_a_corrupt_state_file(mesh_factory) -> None:
    mesh = mesh_factory(3)
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    job = mesh.submit(digits_spec(rounds=5, min_nodes=2, **FAST))
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


def test_partition_minority_waits_and_says_so_then_all_agree(netns_pair: NetnsPair, mesh_factory) -> None:
    majority, minority = [0, 1, 2, 3], [4, 5]
    sides = {i: netns_pair.a if i in majority else netns_pair.b for i in range(6)}
    mesh = mesh_factory(6, placement=lambda i: sides[i].placement())
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    ids = peer_ids(mesh, range(6))
    job = mesh.submit(digits_spec(rounds=6, min_nodes=4, **FAST))

    def level() -> bool:  # every node has fetched the same round's model: no download is cut
        held = {mesh.job(i, job)["round"] for i in range(6)}
        return len(held) == 1 and held.pop() >= 1

    mesh.wait_until(level, 120, interval=0.1, what="all nodes at the same round")
    netns_pair.partition()
    mesh.wait_until(lambda: all("of min_nodes=4" in mesh.job(i, job)["waiting"] for i in minority), 60,
                    interval=0.5, what="the minority saying it cannot reach min_nodes")
    stuck = [mesh.job(i, job)["round"] for i in minority]
    last = max(stuck)
    wait_round(mesh, 0, job, last + 2, timeout=120)  # the majority commits on
    assert [mesh.job(i, job)["round"] for i in minority] == stuck, "the minority committed while cut off"
    for i in minority:
        assert "waiting, only" in mesh.log_path(i).read_text(errors="replace")
    shown = subprocess.run([*sides[4].placement().prefix, sys.executable, "-m", "gpuflex", "job", "status", job,
                            "--node", str(mesh.home(4))], capture_output=True, text=True, timeout=60)
    assert "waiting      only" in shown.stdout, shown.stdout + shown.stderr
    healed_at = mesh.job(0, job)["round"]

    netns_pair.heal()
    mesh.wait_job(job, list(range(6)), timeout=240)
    rows = assert_one_ledger(mesh, list(range(6)), job, 6)
    side_a = {p for p, i in ids.items() if i in majority}
    # Rounds after last + 1 were planned on ledgers the minority did not have.
    assert healed_at >= last + 2
    for row in rows[last + 1 : healed_at]:
        assert {c["peer"] for c in row["contributors"]} <= side_a
    assert len({mesh.job(i, job)["model_hash"] for i in range(6)}) == 1
    assert all(not mesh.job(i, job)["waiting"] for i in range(6))


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
    job = mesh.submit(digits_spec(rounds=6, min_nodes=2, **FAST))
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
    second = mesh.submit(digits_spec(rounds=1, min_nodes=2, **FAST))
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
