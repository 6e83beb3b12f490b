"""Local surfaces of a node under a hostile neighbour: the control API and the bulk side channel.

Real node processes on loopback, with an honest job running on both throughout:

* another local process opens 200 connections to node 0's control API and never shows a token;
* a hostile peer asks node 0 for a blob over the bulk side channel while strangers from
  another local address (127.0.0.2) reach the one-off port first.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from gpuflex.client import ControlClient
from gpuflex.home import CONTROL_FILE
from gpuflex.localmesh import LocalMesh
from mesh import bulk
from mesh.blob import BLOB_PROTOCOL, blob_hash
from mesh.framing import read_obj, write_obj
from mesh.identity import Identity
from mesh.node import MeshConfig, MeshNode
from tests.integration.conftest import HONEST_PACE, light_spec
from tests.integration.honest_job import assert_one_ledger, committed, keeps_committing
from tests.integration.test_hostile_resources import open_fds, rss_mib

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
FAST = {"local_epochs": 1, "plan_timeout_s": 3.0, "train_timeout_s": 12.0, "reduce_timeout_s": 2.0}
#: What 200 idle connections may add to node 0's memory and descriptors once they are closed.
RSS_BUDGET_MIB, FDS_BUDGET = 32, 16


class Local:
    def __init__(self, mesh: LocalMesh) -> None:
        self.mesh = mesh
        self.job = self.short = ""

    def rounds(self) -> int:
        return committed(self.mesh, self.job)

    def keeps_training(self, since: int) -> None:
        keeps_committing(self.mesh, self.job, since)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    mesh = LocalMesh(tmp_path_factory.mktemp("local"), 2)
    try:
        mesh.start(timeout=120)
        mesh.wait_connected(60)
        world = Local(mesh)
        # A short job first: its final model stays on node 0, for the bulk test to fetch.
        world.short = mesh.submit(light_spec(rounds=2, min_nodes=2, **FAST))
        mesh.wait_job(world.short, [0, 1], 120)
        world.job = mesh.submit(light_spec(rounds=1000, min_nodes=2, **FAST, **HONEST_PACE))
        world.keeps_training(0)
        yield world
    finally:
        mesh.close()


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def test_control_connections_without_a_token_are_closed_and_capped(local: Local) -> None:
    """200 connections that never show a token: the owner's client is still served at once, all
    200 are closed within the authentication timeout (plus slack), and node 0 keeps neither
    their memory nor their descriptors."""
    mesh = local.mesh
    pid = mesh.procs[0].pid
    since = local.rounds()
    port = json.loads((mesh.home(0) / CONTROL_FILE).read_text())["port"]
    fds_before, rss_before = open_fds(pid), rss_mib(pid)
    socks = []
    for i in range(200):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            sock.sendall(b'{"method": "status", "params": {"x": "' + b"a" * 1000)  # and never a newline
        sock.setblocking(False)  # checked below without waiting on each
        socks.append(sock)
    try:
        start = time.perf_counter()
        with ControlClient.for_home(mesh.home(0)) as client:
            assert client.call("status")["peer_id"]
        served_s = time.perf_counter() - start
        print(f"the owner's call during the flood took {served_s:.2f} s")
        assert served_s < 3.0
        deadline = time.monotonic() + 20
        open_now = list(socks)
        while open_now and time.monotonic() < deadline:
            open_now = [s for s in open_now if not closed_by_peer(s)]
            time.sleep(0.25)
        print(f"{200 - len(open_now)} of 200 tokenless connections closed by node 0 within 20 s")
        assert not open_now, f"{len(open_now)} connections without a token still open after 20 s"
    finally:
        for sock in socks:
            sock.close()
    mesh.wait_until(lambda: open_fds(pid) <= fds_before + FDS_BUDGET, 20,
                    what=f"node 0's descriptors back near {fds_before}")
    grown = rss_mib(pid) - rss_before
    assert grown < RSS_BUDGET_MIB, f"node 0 grew by {grown:.0f} MiB"
    local.keeps_training(since)


async def test_strangers_do_not_close_the_bulk_port_on_the_real_peer(local: Local, tmp_path: Path) -> None:
    """Twenty connections from 127.0.0.2 reach node 0's one-off bulk port before the requesting
    peer (on 127.0.0.1) dials it: the peer still gets the blob over the side channel."""
    mesh = local.mesh
    since = await trio.to_thread.run_sync(local.rounds)
    status = await trio.to_thread.run_sync(lambda: mesh.call(0, "status"))
    cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=[str(mesh.bootstrap)],
                     data_dir=tmp_path / "hostile", mdns=False)
    async with MeshNode.start(Identity.generate(), cfg) as hostile:
        await fetch_past_strangers(mesh, local.short, hostile, status["peer_id"])
        hostile.stop()
    await trio.to_thread.run_sync(local.keeps_training, since)


async def fetch_past_strangers(mesh: LocalMesh, job: str, hostile: MeshNode, target: str) -> None:
    """Ask ``target`` for a finished job's model over the bulk channel, let twenty strangers
    from 127.0.0.2 reach the offered port first, then dial it and check the blob."""
    digest = (await trio.to_thread.run_sync(lambda: mesh.job(0, job)))["model_hash"]
    stream = await hostile.open(target, BLOB_PROTOCOL, 15)
    await write_obj(stream, {"h": digest, "bulk": bulk.preferred_ciphers()})
    with trio.fail_after(15):
        reply = await read_obj(stream)
    assert isinstance(reply, dict) and reply.get("ok") and "bulk" in reply, reply
    offer, size = bulk.BulkOffer.from_wire(reply["bulk"]), int(reply["size"])

    def strangers() -> int:
        reached = 0
        for _ in range(20):
            with socket.socket() as sock:
                sock.bind(("127.0.0.2", 0))
                sock.settimeout(5)
                try:
                    sock.connect(("127.0.0.1", offer.port))
                except OSError:
                    continue
                reached += 1
                sock.sendall(b"\x00\x00\x00\x22" + os.urandom(34))
        return reached

    reached = await trio.to_thread.run_sync(strangers)
    print(f"{reached} of 20 stranger connections reached the bulk port")
    assert reached >= 8
    data = bytearray()
    receiver = bulk.BulkReceiver("127.0.0.1", offer)
    await trio.to_thread.run_sync(receiver.connect)  # BulkUnavailable once strangers closed the port
    await trio.to_thread.run_sync(receiver.receive, size, lambda chunk: data.extend(chunk))
    await write_obj(stream, {"done": True})
    assert blob_hash(bytes(data)) == digest


def test_the_honest_job_kept_one_ledger(local: Local) -> None:
    assert_one_ledger(local.mesh, local.job, (0, 1), at_least=2)
