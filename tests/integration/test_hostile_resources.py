"""A hostile peer tries to make a node hold memory, threads, file descriptors and CPU; the
node refuses, keeps serving, and the honest job keeps committing with one ledger.

One mesh of real node processes serves every attack in turn (node 2 joins late, as the new
node of the sync attack), and one honest job runs through all of them. The hostile peer is a
bare ``MeshNode`` of our own library in this process, with its own key, speaking the wire
protocol directly. Under each attack the honest job commits a round, and a watcher process
checks that node 0's control API answers within a second and its memory stays in budget.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.ledger import Ledger, verify_chain
from gpuflex.node.core.messages import ABORT, JOB, UPDATE
from gpuflex.node.jobs import job_id_of
from mesh.blob import BLOB_PROTOCOL
from mesh.codec import open_envelope, seal
from mesh.framing import read_obj, write_frame, write_obj
from mesh.identity import Identity
from mesh.limits import PeerLimits
from mesh.messaging import GOSSIP_PROTOCOL, MSG_PROTOCOL
from mesh.node import MeshConfig, MeshNode
from tests.integration.conftest import HONEST_PACE, digits_spec, light_spec, load_factor
from tests.integration.hostile_peer import send_raw

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
READ_TIMEOUT_S = 2.0  # node 0's --read-timeout, short so the stalled streams end quickly
#: What an attack may add to node 0's resident memory (an honest job's run included) ...
RSS_BUDGET_MIB = 64
#: ... and the 72 jobs, which node 0 holds as it should (their specs, ledgers and models).
RSS_JOBS_BUDGET_MIB = 256
#: Node 0's control API answers nine calls in ten within a second, and none takes over three
#: (a frozen node answers none): on a loaded 2-core machine a single call may wait its turn
#: for a core, which is the machine's delay, not the node's.
API_BUDGET_S = 1.0
API_WORST_S = 3.0
FAST = {"local_epochs": 1, "plan_timeout_s": 3.0, "train_timeout_s": 12.0, "reduce_timeout_s": 2.0}
LIMITS = PeerLimits()
#: Node 0's gossip limit per origin, below the default so that a flood from this process beats
#: it even on a loaded machine (the honest job's few messages a round stay well under it).
GOSSIP_RATE, GOSSIP_BURST = 2.0, 20.0
FLOOD = 200


#: The honest job runs through every attack and is still running at the end.
HONEST_ROUNDS = 1000


@dataclass
class Honest:
    mesh: LocalMesh
    ids: list[str]
    job: str = ""

    def pid(self, i: int = 0) -> int:
        return self.mesh.procs[i].pid

    def rounds(self) -> int:
        """The round both honest nodes have committed."""
        return min(self.mesh.job(i, self.job)["round"] for i in (0, 1))

    def keeps_training(self, since: int) -> None:
        """Both honest nodes commit a round after round ``since`` (the attack's start)."""
        self.mesh.wait_until(lambda: self.rounds() > since, 120, interval=0.5,
                             what=f"the honest job committing past round {since}")

    def peer_row(self, peer: str) -> dict[str, Any]:
        return next(r for r in self.mesh.call(0, "peers") if r["peer_id"] == peer)


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Honest]:
    gossip = ["--gossip-rate", str(GOSSIP_RATE), "--gossip-burst", str(GOSSIP_BURST)]
    # The job caps are raised for the 72 jobs of the sync test (nine publishers, eight each).
    caps = ["--max-jobs", "100", "--max-jobs-per-publisher", "8"]
    mesh = LocalMesh(tmp_path_factory.mktemp("resources"), 3, extra_args=["--read-timeout", str(READ_TIMEOUT_S), *caps],
                     node_args=lambda i: gossip if i == 0 else [])
    try:
        mesh.start(timeout=120, count=2)
        mesh.wait_connected(60)
        honest = Honest(mesh, [mesh.call(i, "status")["peer_id"] for i in range(2)])
        honest.job = mesh.submit(light_spec(rounds=HONEST_ROUNDS, min_nodes=2, **FAST, **HONEST_PACE))
        honest.keeps_training(0)
        yield honest
    finally:
        mesh.close()


# -- what /proc says of node 0 --------------------------------------------------------------------

def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds of the node's trio thread (training runs on worker threads)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds of the whole node process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- the hostile peer and the watcher --------------------------------------------------------------

@asynccontextmanager
async def hostile_peer(honest: Honest, tmp_path: Path, name: str = "hostile") -> AsyncIterator[MeshNode]:
    cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=[str(honest.mesh.bootstrap)],
                     data_dir=tmp_path / name, mdns=False)
    async with MeshNode.start(Identity.generate(), cfg) as node:
        yield node
        node.stop()


#: The watcher: a process of its own that calls node 0's ``status`` every ``every`` seconds
#: and prints each latency with node 0's resident memory then, so the hostile peer's work in
#: this process never delays the measurement.
WATCHER = """
import sys, time
from gpuflex.client import ControlClient
home, pid, every = sys.argv[1], sys.argv[2], float(sys.argv[3])
while True:
    start = time.perf_counter()
    with ControlClient.for_home(home) as client:
        client.call("status")
    took = time.perf_counter() - start
    with open(f"/proc/{pid}/status") as fh:
        rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024
    print(took, rss, flush=True)
    time.sleep(every)
"""


@dataclass
class Watch:
    """What the watcher saw of node 0 during one attack."""

    rss_before: float
    latencies: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)

    @property
    def rss_grown(self) -> float:
        return max(self.rss, default=self.rss_before) - self.rss_before


@asynccontextmanager
async def api_watch(honest: Honest, every: float = 0.25) -> AsyncIterator[Watch]:
    """Watches node 0 all along, from another process; the ``Watch`` is filled when the
    block ends."""
    watch = Watch(rss_mib(honest.pid()))
    proc = subprocess.Popen([sys.executable, "-c", WATCHER, str(honest.mesh.home(0)), str(honest.pid()), str(every)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        await trio.sleep(1.0)  # its imports; the first call then falls within the attack
        yield watch
    finally:
        proc.terminate()
        out, err = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=10))
        for line in out.splitlines():
            took, rss = line.split()
            watch.latencies.append(float(took))
            watch.rss.append(float(rss))
        if proc.returncode not in (0, -15):
            raise AssertionError(f"the control API watcher failed: {err[-2000:]}")


async def dropped_within(stream: Any, seconds: float) -> bool:
    """Whether node 0 ends ``stream`` (a reset or an end) within ``seconds``."""
    with trio.move_on_after(seconds):
        try:
            while True:
                await stream.read(65536)
        except Exception:  # py-libp2p's reset and EOF errors share no base class
            return True
    return False


def assert_served(watch: Watch, rss_budget_mib: float = RSS_BUDGET_MIB) -> None:
    """Node 0's control API answered in time and its memory stayed within the budget."""
    api = watch.latencies
    assert len(api) >= 3, f"the control API was asked only {len(api)} times"
    ranked = sorted(api)
    p90 = ranked[int(0.9 * (len(ranked) - 1))]
    shown = f"{len(api)} calls: median {ranked[len(ranked) // 2]:.3f} s, 90% {p90:.3f} s, worst {ranked[-1]:.2f} s"
    print(f"node 0 during the attack: {shown}; resident memory grew {watch.rss_grown:.0f} MiB at most")
    # The worst call waits its turn for a core on a loaded machine: its bound scales with the load.
    assert p90 < API_BUDGET_S and ranked[-1] < API_WORST_S * load_factor(), f"control API too slow: {shown}"
    assert watch.rss_grown < rss_budget_mib, f"node 0 grew by {watch.rss_grown:.0f} MiB (budget {rss_budget_mib})"


# -- the attacks ------------------------------------------------------------------------------------

async def test_announced_gigabytes_and_stalled_frames_hold_no_memory(honest: Honest, tmp_path: Path) -> None:
    job, since, target = honest.job, honest.rounds(), honest.ids[0]
    async with hostile_peer(honest, tmp_path) as hostile, api_watch(honest) as api:
        announced = []
        for _ in range(3):  # a signed update of the running job, announcing a 1 GiB payload
            stream = await hostile.open(target, MSG_PROTOCOL, 10)
            frame = seal(hostile.identity, UPDATE, {"job": job, "round": 1})
            await stream.write(len(frame).to_bytes(4, "big") + frame + (1 << 30).to_bytes(8, "big"))
            announced.append(stream)
        stalled = []
        for _ in range(4):  # a 15 MiB frame, of which 256 KiB arrive, then nothing
            stream = await hostile.open(target, MSG_PROTOCOL, 10)
            await stream.write((15 << 20).to_bytes(4, "big") + bytes(256 << 10))
            stalled.append(stream)
        sent = trio.current_time()
        refused = [await dropped_within(s, 5) for s in announced]
        await trio.sleep(0.5)
        cut = [await dropped_within(s, READ_TIMEOUT_S + 8) for s in stalled]
        cut_after = trio.current_time() - sent
        penalty = honest.peer_row(hostile.peer_id)["penalty"]
    assert all(refused), "a payload announced beyond its kind's limit was not refused at once"
    assert all(cut) and cut_after >= READ_TIMEOUT_S, "stalled frames were not dropped after the read timeout"
    assert penalty >= 4, f"penalty {penalty}: 3 oversized payloads and 4 stalled frames"
    assert_served(api)
    honest.keeps_training(since)


async def test_stream_and_blob_request_floods_are_capped(honest: Honest, tmp_path: Path) -> None:
    job, since, pid, target = honest.job, honest.rounds(), honest.pid(), honest.ids[0]
    digest = honest.mesh.job(0, job)["model_hash"]

    async def export() -> float:
        start = time.perf_counter()
        files = await trio.to_thread.run_sync(lambda: honest.mesh.call(
            0, "job_results", {"job": job, "out": str(tmp_path / "export")}, timeout=90))
        assert files["files"]
        return time.perf_counter() - start

    quiet_export_s = await export()
    fds_before = open_fds(pid)
    replies: list[Any] = []
    async with hostile_peer(honest, tmp_path) as hostile:

        async def ask_and_never_dial() -> None:  # a blob request whose bulk offer is never taken
            try:
                stream = await hostile.open(target, BLOB_PROTOCOL, 10)
                await write_obj(stream, {"h": digest, "bulk": ["aes256gcm", "chacha20poly1305"]})
                with trio.move_on_after(3):
                    replies.append(await read_obj(stream))
            except Exception:  # refused: the stream was reset
                replies.append(None)

        async def open_and_say_nothing() -> None:
            with suppress(Exception):  # refused
                await hostile.open(target, MSG_PROTOCOL, 10)

        async with api_watch(honest) as api, trio.open_nursery() as nursery:
            for _ in range(100):
                nursery.start_soon(ask_and_never_dial)
            for _ in range(50):
                nursery.start_soon(open_and_say_nothing)
        fds = open_fds(pid) - fds_before
        # The node's own export (its plot and files hold the interpreter a while: not timed by
        # the watcher), while the requests' listeners would still be open.
        export_s = await export()
    offers = [r for r in replies if isinstance(r, dict) and "bulk" in r]
    assert len(offers) <= LIMITS.bulk_per_peer, f"{len(offers)} bulk listeners opened for one peer"
    assert fds < 3 * LIMITS.blob_serves_per_peer + 16, f"{fds} more file descriptors held"
    # Before, each such request parked a worker thread for 15 s and the export queued behind them.
    assert export_s < quiet_export_s + 5, f"the node's own export took {export_s:.1f} s ({quiet_export_s:.1f} s quiet)"
    assert_served(api)
    honest.keeps_training(since)


async def test_gossip_flood_from_one_origin_is_rate_limited(honest: Honest, tmp_path: Path) -> None:
    """The hostile peer gossips to node 0 alone; node 1 (default limits, far above node 0's)
    logs each copy node 0 relays to it, so its log counts what node 0 let through."""
    since, target = honest.rounds(), honest.ids[0]
    async with hostile_peer(honest, tmp_path) as hostile, api_watch(honest) as api:
        sent = trio.current_time()

        async def flood(first: int) -> None:
            for i in range(first, FLOOD, 8):
                with suppress(Exception):  # a stream node 0 refuses (at its stream limit) is lost
                    stream = await hostile.open(target, GOSSIP_PROTOCOL, 10)
                    await write_frame(stream, seal(hostile.identity, ABORT,
                                                   {"job": "0" * 16, "round": 1, "attempt": i}))
                    await stream.close()

        async with trio.open_nursery() as nursery:
            for first in range(8):
                nursery.start_soon(flood, first)
        elapsed = trio.current_time() - sent
        await trio.sleep(2.0)  # relays in flight land
        mark = f"ignored gossiped {ABORT} from {hostile.peer_id[-8:]}"
        relayed = honest.mesh.log_path(1).read_text(errors="replace").count(mark)
    allowed = GOSSIP_BURST + GOSSIP_RATE * (elapsed + 2.0) + 10
    print(f"node 0 relayed {relayed} of {FLOOD} gossip messages from one origin in {elapsed:.1f} s")
    assert GOSSIP_BURST / 2 <= relayed <= allowed, f"node 0 relayed {relayed} of {FLOOD} in {elapsed:.1f} s"
    assert_served(api)
    honest.keeps_training(since)


async def test_a_job_whose_members_are_all_gone_waits_at_no_cost(honest: Honest, tmp_path: Path) -> None:
    since, pid, target = honest.rounds(), honest.pid(), honest.ids[0]
    async with hostile_peer(honest, tmp_path) as hostile, api_watch(honest) as api:
        # What node 0's main thread spends on the honest job beside it, measured just before:
        # the orphan job must add nothing to it (a driver spinning on it used a whole core).
        cpu, start = main_thread_cpu_s(pid), time.monotonic()
        await trio.sleep(3)
        baseline = (main_thread_cpu_s(pid) - cpu) / (time.monotonic() - start)
        spec = digits_spec(rounds=2, name="orphan")
        frame = seal(hostile.identity, JOB, {"spec": spec, "members": [Identity.generate().peer_id],
                                             "created": time.time()})
        await hostile.request(target, frame)
        orphan = job_id_of(open_envelope(frame))
        await in_thread(lambda: honest.mesh.wait_until(
            lambda: "are gone" in honest.mesh.job(0, orphan)["waiting"], 30, interval=0.2,
            what="the orphan job saying its members are gone"))
        cpu, start = main_thread_cpu_s(pid), time.monotonic()
        await trio.sleep(3)
        load = (main_thread_cpu_s(pid) - cpu) / (time.monotonic() - start)
        status = honest.mesh.job(0, orphan)
    assert status["state"] == "running" and status["round"] == 0
    assert load - baseline < 0.25, (f"node 0's main thread used {load:.0%} of a core while the orphan job "
                                    f"waited, {baseline:.0%} just before it came")
    assert_served(api)
    honest.keeps_training(since)


async def in_thread(wait: Callable[[], object]) -> None:
    """Run a blocking wait on a worker thread, so the hostile peer's own trio loop in this
    process keeps answering (a node that dials it meanwhile would otherwise wait out a timeout)."""
    await trio.to_thread.run_sync(wait)


async def test_seventy_two_jobs_sync_in_pages_to_a_new_node(honest: Honest, tmp_path: Path) -> None:
    """Jobs whose frames together pass the 16 MiB frame limit (each near its kind's 256 KiB,
    with 4,600 members: 17 MiB in all); from nine keys, so a cap on jobs per publisher does not
    turn them away."""
    since, target = honest.rounds(), honest.ids[0]
    filler = [Identity(bytes([7, i % 256, i // 256]) + bytes(29)).peer_id for i in range(4600)]
    async with hostile_peer(honest, tmp_path) as hostile, api_watch(honest) as api:
        frames: dict[str, bytes] = {}
        for k in range(9):
            key = Identity.generate()
            for j in range(8):
                body = {"spec": digits_spec(rounds=1, name=f"bulk-{k}-{j}"), "members": [hostile.peer_id, *filler],
                        "created": time.time()}
                frame = seal(key, JOB, body)
                frames[job_id_of(open_envelope(frame))] = frame
                await send_raw(hostile, target, frame, tries=6)
        published = set(frames)

        def held(i: int) -> set[str]:
            return {j["job_id"] for j in honest.mesh.call(i, "jobs")}

        # Node 0 reads a frame within --read-timeout (2 s); a loaded one may not, and drops it. Idle,
        # it holds all 72 within a few seconds: what it lacks after 10 s is sent again, not
        # waited for (in a whole suite's run, waiting 30 s a time made this test take 200 s).
        for attempt in range(6):
            try:
                await in_thread(lambda: honest.mesh.wait_until(lambda: published <= held(0), 10 * load_factor(),
                                                               interval=0.5, what="node 0 holding the 72 jobs"))
                break
            except TimeoutError:
                if attempt == 5:
                    raise
                for job_id in published - held(0):
                    await send_raw(hostile, target, frames[job_id], tries=6)
        await trio.to_thread.run_sync(honest.mesh.start_node, 2)
        await in_thread(lambda: honest.mesh.wait_until(lambda: published <= held(2), 60 * load_factor(), interval=0.5,
                                                       what="the new node learning every job"))
        shown = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "gpuflex", "status", "--home", str(honest.mesh.home(0))],
            capture_output=True, text=True, timeout=60))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert sum(line.startswith("job ") for line in shown.stdout.splitlines()) >= 72
    assert_served(api, RSS_JOBS_BUDGET_MIB)
    honest.keeps_training(since)


def test_the_honest_job_kept_one_ledger_on_every_node(honest: Honest) -> None:
    """Through every attack: one chain of committed rounds, the same on all three nodes (node 2
    caught up on it by sync), as far as each has got."""
    if 2 not in honest.mesh.procs:  # the sync test failed before it started node 2
        honest.mesh.start_node(2)
    assert_one_ledger(honest.mesh, honest.job, honest.rounds(), 5)
    print("CPU seconds of the nodes:", ", ".join(f"{process_cpu_s(honest.pid(i)):.1f}" for i in range(3)))


def assert_one_ledger(mesh: LocalMesh, job: str, committed: int, at_least: int) -> None:
    """Nodes 0 to 2 alive, node 2 caught up to within a round of ``committed``, and one chain of
    at least ``at_least`` verified rounds, the same on every node as far as each has got."""
    assert all(mesh.alive(i) for i in range(3)), f"a node died: see {mesh.base}"
    mesh.wait_until(lambda: mesh.job(2, job)["round"] >= committed - 1, 120, interval=0.5,
                    what="node 2 catching up on the honest job")
    frames = []
    for i in range(3):
        ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
        assert ledger.load() == []
        frames.append(ledger.frames)
    common = min(map(len, frames))
    assert common >= at_least, f"only {common} rounds committed through the attacks"
    assert frames[0][:common] == frames[1][:common] == frames[2][:common]
    assert [r.round for r in verify_chain(frames[0], job)] == list(range(1, len(frames[0]) + 1))
