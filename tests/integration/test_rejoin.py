"""Rejoining after restarts, with real node processes on loopback: the first node comes back on
a new port, the others find the mesh again through their address books, and a node restarted
with no --bootstrap at all waits for its book's peers. Both tests share one 3-node mesh
(started once for the module), in this order."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gpuflex.localmesh import LocalMesh, free_port
from tests.integration.conftest import digits_spec
from tests.integration.test_faults import FAST, assert_one_ledger, peer_ids, wait_round

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def book_addrs(mesh: LocalMesh, i: int) -> dict[str, list[str]]:
    """Node ``i``'s address book as saved on disk: peer id -> addresses."""
    try:
        doc = json.loads((mesh.home(i) / "peers.json").read_text())
    except (OSError, ValueError):
        return {}
    return {e["peer_id"]: e["addrs"] for e in doc["peers"]}


def listen_addr(mesh: LocalMesh, i: int) -> str:
    return mesh.call(i, "status")["addrs"][0].split("/p2p/")[0]


def wait_in_book(mesh: LocalMesh, i: int, peer: str, addr: str, timeout: float = 30) -> None:
    mesh.wait_until(lambda: addr in book_addrs(mesh, i).get(peer, []), timeout, interval=0.3,
                    what=f"node {i}'s saved address book listing {addr}")


def join_state(mesh: LocalMesh, i: int) -> str:
    return str(mesh.call(i, "status")["join"]["state"])


# Extra ``node start`` arguments per node, read at each (re)start.
EXTRA: dict[int, list[str]] = {}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    EXTRA.clear()
    mesh = LocalMesh(tmp_path_factory.mktemp("rejoin"), 3, node_args=lambda i: EXTRA.get(i, []))
    try:
        mesh.start(timeout=120)
        mesh.wait_connected(60)
        yield mesh
    finally:
        mesh.close()


def all_up(mesh: LocalMesh) -> None:
    """Every node running and connected (a failed test before may have left one down), and
    every node's saved book listing every other node where it listens now: a node's book is
    written within seconds of meeting a peer, and the tests kill nodes right after this."""
    for i in range(mesh.size):
        if not mesh.alive(i):
            mesh.start_node(i)
    mesh.wait_connected(60)
    ids = peer_ids(mesh, range(mesh.size))
    for peer, j in ids.items():
        for i in range(mesh.size):
            if i != j:
                wait_in_book(mesh, i, peer, listen_addr(mesh, j))


def test_the_bootstrap_node_moves_and_restarted_nodes_rejoin_through_their_books(mesh: LocalMesh) -> None:
    all_up(mesh)
    ids = peer_ids(mesh, range(3))
    by_node = {i: p for p, i in ids.items()}
    # min_nodes = every node: a round commits only once each restarted node is back in the job.
    # Four local epochs, as this test always had: round 2 trains for a few seconds, so the kills
    # of nodes 1 and 2 below land inside it.
    job = mesh.submit(digits_spec(rounds=2, min_nodes=3, **{**FAST, "local_epochs": 4}))

    # The first node, every other node's --bootstrap, dies as its job starts and comes back on
    # another port; round 1 cannot be planned without it.
    original = mesh.bootstrap
    assert original is not None
    mesh.kill(0, signal.SIGKILL)
    mesh.start_node(0, port=free_port())
    moved = listen_addr(mesh, 0)
    assert moved != original.split("/p2p/")[0]
    mesh.wait_until(lambda: join_state(mesh, 0) == "connected", 60, what="node 0 back in the mesh")
    for i in (1, 2):  # the others learn where it went (its signed NodeInfo) and save it
        wait_in_book(mesh, i, by_node[0], moved)
    wait_round(mesh, 0, job, 1, timeout=120)  # node 0 took its job up again

    # Two more restarts, with the first node's original (now dead) address still on their
    # command line: they get back in through what their books know.
    for i in (1, 2):
        mesh.kill(i, signal.SIGKILL)
    for i in (1, 2):
        mesh.start_node(i, wait=False)
    for i in (1, 2):
        mesh.wait_api(i, timeout=90)
        assert "--bootstrap" in mesh.args[i] and original in mesh.args[i]
    mesh.wait_job(job, [0, 1, 2], timeout=240)
    rows = assert_one_ledger(mesh, [0, 1, 2], job, 2)
    assert all({c["peer"] for c in row["contributors"]} == set(ids) for row in rows)  # each took part
    for i in range(3):
        assert join_state(mesh, i) == "connected"
        log = mesh.log_path(i).read_text(errors="replace")
        assert "cannot reach any bootstrap peer" not in log
        assert log.count("starting a new mesh") == (1 if i == 0 else 0)  # only at the very first start


def test_a_node_restarted_without_bootstrap_waits_for_its_book_peers_then_rejoins(mesh: LocalMesh) -> None:
    all_up(mesh)
    first = listen_addr(mesh, 0)
    wait_in_book(mesh, 1, mesh.call(0, "status")["peer_id"], first)

    # All stop; node 1 comes back first, with no --bootstrap at all and a 3 s bootstrap timeout
    # (a brand-new node would give up after it), and no one answers it.
    for i in range(mesh.size):
        mesh.kill(i, signal.SIGKILL)
    EXTRA[1] = ["--bootstrap-timeout", "3"]
    started = time.time()
    mesh.start_node(1, bootstrap=False)
    assert "--bootstrap" not in mesh.args[1]
    assert join_state(mesh, 1) == "waiting"  # up, and patient: it has been in a mesh
    mesh.wait_until(lambda: time.time() - started > 3 + 1, 10, what="past --bootstrap-timeout")
    shown = subprocess.run([sys.executable, "-m", "gpuflex", "status", "--home", str(mesh.home(1))],
                           capture_output=True, text=True, timeout=60)
    assert "join     waiting: no known peer answered" in shown.stdout, shown.stdout + shown.stderr
    assert "retrying in" in shown.stdout
    assert mesh.alive(1)
    assert "keeps trying" in mesh.log_path(1).read_text(errors="replace")

    # The first node comes back (no --bootstrap either) on the port it had: node 1's next try
    # reaches it.
    mesh.start_node(0)
    assert listen_addr(mesh, 0) == first
    mesh.wait_until(lambda: join_state(mesh, 1) == "connected", 90, what="node 1 back in the mesh")
    mesh.wait_connected(60)
    assert mesh.alive(1)
