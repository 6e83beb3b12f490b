"""Side by side with hivemind: DHT store and get at 64 and 256 peers, and averaging a
10M-parameter float32 vector across 4 and 8 peers.

hivemind (1.1.12, whose wheel ships Go's p2pd) is the closest existing system to the GPUFlex
mesh, so it is the yardstick. It runs from a venv of its own, ``.bench/venvs/hivemind``,
made on first use: torch pinned to the local CPU build first, then hivemind under a
constraint that keeps that torch. Both systems run on this machine, on 127.0.0.1, in the
same run, and the ratios printed compare figures taken minutes apart on the same cores.

**DHT.** The procedure of :mod:`benchmarks.dht_lookup`, run for both systems by its own
coordinator: peers hosted ``--per-process`` to a process (GPUFlex: MeshNodes sharing a trio
loop; hivemind: DHTNodes sharing an asyncio loop, each with its own p2pd daemon, which is
how hivemind runs a peer), all bootstrapped from peer 0; once routing tables stop growing
every peer stores one value, all at once, then each hosting process looks up values stored
by others one at a time, round-robin over its peers, until the budget is spent. A direct
request to the value's owner (hivemind: its DHT ping RPC) is the baseline in the same run;
when it fails too, the host is saturated, not the DHT. Each DHT keeps its defaults
(py-libp2p: k = 20 replicas; hivemind: 5 replicas, 3 s RPC timeout). Peak memory of each
mesh's processes (proportional set size) is sampled, and a size that, extrapolated from the
system's smaller run, would not fit in the memory the machine has free is skipped with a
row that says so, rather than pushing a shared machine into swap.

**Averaging.** N processes each hold their own float32 vector (new every trial); the figure
is the wall time from a common start instant until the last peer holds the average, which
every peer checks against the exact mean. hivemind: ``DecentralizedAverager`` (butterfly
all-reduce) with its group formed beforehand, as hivemind's Optimizer pre-schedules it;
matchmaking is timed apart. GPUFlex: the reduce of a round without the training: vectors
signed and sent up the group tree (group size 4) with ``MeshNode.request``, folded by each
leader into the streaming weighted mean as they land, the root's average stored as a blob
and announced by gossip, and every peer fetching it from the root with
``MeshNode.fetch_blob`` and checking its hash, as members fetch a committed model. Both
sets of peers stay up while trials alternate between the systems. A trial that fails
(hivemind finding no group within a minute, a GPUFlex transfer timing out) is counted and
named, and the next trial starts afresh.

Run:

    python -m benchmarks.vs_hivemind [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    TORCH_PIN,
    Channel,
    SideVenvError,
    Worker,
    WorkerError,
    add_json_flag,
    add_role_flag,
    describe_error,
    emit,
    format_table,
    log,
    ratio,
    run_in_turns,
    side_venv,
    stop_on_sigterm,
    wait_until,
    workers,
)

HIVEMIND = "hivemind==1.1.12"
# hivemind's P2P defaults, less whatever would reach past loopback (UPnP, AutoNAT, relays).
P2P_KWARGS: dict[str, Any] = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False,
                              "auto_nat": False, "use_relay": False}
GROUP_SIZE = 4  # the job file's default
LOOKUPS = 2
MAX_ERROR = 1e-5  # float32 means of values in [0, 1): rounding stays near 1e-7
START_LEAD_S = 1.0
START_TIMEOUT_S = 180.0
CONNECT_TIMEOUT_S = 120.0
TRIAL_TIMEOUT_S = 120.0
MATCHMAKING_TIMEOUT_S = 60.0
WORKER_DEADLINE_S = 3600.0
MEMORY_MARGIN_MB = 3072.0  # left to the rest of the machine
VEC_KIND = "bench_vec"
AVG_KIND = "bench_avg"
PREFIX = "bench"


def hivemind_python() -> str:
    """The interpreter of hivemind's venv, made first if it is missing or broken."""
    python, version = side_venv("hivemind", "hivemind", [HIVEMIND])
    if version != HIVEMIND.split("==")[1]:
        raise SideVenvError(f"hivemind's venv has hivemind {version}, wanted {HIVEMIND}")
    return str(python)


# -- shared by both systems' peers -------------------------------------------------------------


def vector_for(seed: int, trial: int, index: int, size: int) -> np.ndarray:
    """Peer ``index``'s vector in ``trial``: new every trial, so no blob or cache carries over."""
    return np.random.default_rng([seed, trial, index]).random(size, dtype=np.float32)


def max_error(result: np.ndarray, seed: int, trial: int, peers: int) -> float:
    """Largest deviation of ``result`` from the exact mean of every peer's vector."""
    exact = np.zeros(result.size, dtype=np.float64)
    for index in range(peers):
        exact += vector_for(seed, trial, index, result.size)
    exact /= peers
    return float(np.max(np.abs(result.astype(np.float64) - exact)))


class AsyncChannel(Channel):
    """The worker side of :class:`Worker` for asyncio: a daemon thread reads stdin, so the
    loop goes on serving peers between commands and never waits on it at exit.

    It reads a duplicate of fd 0, not ``sys.stdin``: hivemind forks its DHT and averager, a
    forked multiprocessing child closes ``sys.stdin`` first thing, and it would wait forever
    on the lock this thread held at the fork.
    """

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        stream = os.fdopen(os.dup(sys.stdin.fileno()), "r")

        def pump() -> None:
            with stream:
                for line in iter(stream.readline, ""):
                    loop.call_soon_threadsafe(self.queue.put_nowait, line)
            loop.call_soon_threadsafe(self.queue.put_nowait, "")

        threading.Thread(target=pump, daemon=True).start()

    async def recv(self, timeout: float) -> dict[str, Any] | None:
        try:
            line = await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return None
        return json.loads(line) if line.strip() else None


def run_asyncio_worker(main: Callable[[Channel, dict[str, Any]], Any], args_json: str) -> None:
    """:func:`benchmarks.common.run_worker` for hivemind's peers, which run on asyncio."""
    sent: list[Channel] = []

    async def guarded() -> None:
        sent.append(AsyncChannel())
        await asyncio.wait_for(main(sent[0], json.loads(args_json)), WORKER_DEADLINE_S)

    try:
        asyncio.run(guarded())
    except BaseException as exc:
        (sent[0] if sent else Channel()).send({"error": describe_error(exc)})
        raise


# -- hivemind: DHT host (hivemind's venv) ------------------------------------------------------


async def _timed(op: str, local: bool, make: Callable[[], Any], check: Callable[[Any], bool],
                 timeout: float) -> dict[str, Any]:
    """One operation, a sample in dht_lookup's shape; a timeout or exception is a failure."""
    ok = False
    start = time.perf_counter()
    with contextlib.suppress(Exception):
        ok = bool(check(await asyncio.wait_for(make(), timeout)))
    ms = (time.perf_counter() - start) * 1000
    log(f"{op}: {'ok' if ok else 'FAILED'} in {ms:.0f} ms{' (local)' if local else ''}")
    return {"op": op, "local": local, "ok": ok, "ms": ms}


class HivemindHost:
    """``count`` hivemind DHTNodes sharing this process; answers dht_lookup's commands."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.first, self.count, self.bootstrap = int(args["first"]), int(args["count"]), str(args["bootstrap"])
        self.op_timeout, self.put_timeout = float(args["op_timeout_s"]), float(args["put_timeout_s"])
        self.nodes: list[Any] = []

    async def start(self) -> str:
        from hivemind.dht.node import DHTNode

        addr = self.bootstrap
        for _ in range(self.count):
            node = await DHTNode.create(initial_peers=[addr] if addr else None, **P2P_KWARGS)
            self.nodes.append(node)
            addr = addr or str((await node.get_visible_maddrs())[0])
        return addr if self.bootstrap else str((await self.nodes[0].get_visible_maddrs())[0])

    def sizes(self) -> list[int]:
        return [sum(len(b.nodes_to_peer_id) for b in n.protocol.routing_table.buckets) for n in self.nodes]

    async def put(self, keys: int) -> dict[str, Any]:
        from hivemind.utils import get_dht_time

        owners: dict[str, str] = {}
        samples: list[dict[str, Any]] = []
        expires = get_dht_time() + 3600

        async def put_all(i: int, node: Any) -> None:
            for j in range(keys):
                key, value = f"/{PREFIX}/{i}-{j}", f"{node.peer_id}:{j}".encode()
                samples.append(await _timed("put_value", False, lambda k=key, v=value: node.store(k, v, expires),
                                            bool, self.put_timeout))
                owners[key] = str(node.peer_id)

        await asyncio.gather(*(put_all(i, node) for i, node in enumerate(self.nodes, start=self.first)))
        return {"owners": owners, "samples": samples}

    @staticmethod
    def _holds(node: Any, key: str) -> bool:
        from hivemind.dht.routing import DHTID

        key_id = DHTID.generate(source=key)
        return node.protocol.storage.get(key_id) is not None or node.protocol.cache.get(key_id) is not None

    def _ops(self, node: Any, key: str, owner: str, held: bool) -> list[Callable[[], Any]]:
        """A get of ``key`` and, as the baseline, a ping of the peer that stored it."""
        from hivemind.p2p import PeerID

        expected, peer = f"{owner}:".encode(), PeerID.from_base58(owner)

        def found(v: Any) -> bool:
            return v is not None and isinstance(v.value, bytes) and v.value.startswith(expected)

        return [lambda: _timed("get_value", held, lambda: node.get(key), found, self.op_timeout),
                lambda: _timed("direct_request", False, lambda: node.protocol.call_ping(peer),
                               lambda r: r is not None, self.op_timeout)]

    async def lookup(self, owners: dict[str, str], lookups: int, seed: int, budget_s: float) -> dict[str, Any]:
        """Per node, gets of values others stored (preferring ones it does not hold), each
        with its owner's ping, scheduled as dht_lookup schedules its operations."""
        rng = random.Random(seed * 1_000 + self.first)
        per_node: list[list[list[Callable[[], Any]]]] = []
        held_share: list[float] = []
        for node in self.nodes:
            theirs = sorted(k for k, owner in owners.items() if owner != str(node.peer_id))
            remote = [k for k in theirs if not self._holds(node, k)]
            held_share.append(1.0 - len(remote) / max(1, len(theirs)))
            keys = rng.sample(remote or theirs, min(lookups, len(remote or theirs)))
            per_node.append([self._ops(node, key, owners[key], not remote) for key in keys])
        samples, planned = await run_in_turns(per_node, budget_s)
        return {"samples": samples, "held_share": held_share, "planned": planned}


async def hivemind_dht_host(channel: Channel, args: dict[str, Any]) -> None:
    host = HivemindHost(args)
    try:
        addr = await host.start()
        channel.send({"addr": addr, "peers": [str(n.peer_id) for n in host.nodes]})
        while (cmd := await channel.recv(600)) is not None:
            if cmd["cmd"] == "rt":
                channel.send({"sizes": host.sizes()})
            elif cmd["cmd"] == "put":
                channel.send(await host.put(int(cmd["keys"])))
            elif cmd["cmd"] == "lookup":
                channel.send(await host.lookup(cmd["owners"], int(cmd["lookups"]), int(cmd["seed"]),
                                               float(cmd["budget_s"])))
            else:
                channel.send({"error": f"unknown command {cmd['cmd']!r}"})
    finally:
        for node in host.nodes:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(node.shutdown(), 5)


# -- hivemind: averaging peer (hivemind's venv) ------------------------------------------------


async def hivemind_avg_peer(channel: Channel, args: dict[str, Any]) -> None:
    """One DecentralizedAverager; ``prepare`` forms the group, ``go`` runs the all-reduce."""
    import hivemind
    import torch
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.control import AveragingStage

    peers, size, index, seed = int(args["peers"]), int(args["size"]), int(args["index"]), int(args["seed"])
    dht = hivemind.DHT(initial_peers=[args["bootstrap"]] if args["bootstrap"] else None, start=True, **P2P_KWARGS)
    averager = DecentralizedAverager(
        [torch.zeros(size)], dht, prefix=PREFIX, target_group_size=peers, min_group_size=peers, start=True)
    try:
        channel.send({"addr": str(dht.get_visible_maddrs()[0]), "peer": str(dht.peer_id)})
        control: Any = None
        while (cmd := await channel.recv(600)) is not None:
            trial = int(cmd["trial"])
            try:
                if cmd["cmd"] == "prepare":
                    if control is not None and not control.done():
                        control.cancel()  # a step left over from a failed trial
                    with averager.get_tensors() as tensors:
                        tensors[0].copy_(torch.from_numpy(vector_for(seed, trial, index, size)))
                    start = time.perf_counter()
                    control = averager.step(require_trigger=True, wait=False, timeout=MATCHMAKING_TIMEOUT_S)
                    deadline = time.monotonic() + MATCHMAKING_TIMEOUT_S
                    while control.stage != AveragingStage.AWAITING_TRIGGER and not control.done():
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"no averaging group within {MATCHMAKING_TIMEOUT_S:.0f}s")
                        await asyncio.sleep(0.02)
                    if control.done():
                        control.result()  # raises the reason matchmaking failed
                    channel.send({"matchmaking_s": time.perf_counter() - start})
                elif cmd["cmd"] == "go":
                    await asyncio.sleep(max(0.0, float(cmd["start_at"]) - time.time()))
                    control.allow_allreduce()
                    await asyncio.to_thread(control.result, TRIAL_TIMEOUT_S)
                    done_at = time.time()
                    with averager.get_tensors() as tensors:
                        result = tensors[0].numpy().copy()
                    channel.send({"done_at": done_at, "max_error": max_error(result, seed, trial, peers)})
            except Exception as exc:  # a failed trial is a result too; the next one starts afresh
                channel.send({"failed": f"{exc.__class__.__name__}: {exc}"})
    finally:
        averager.shutdown()
        dht.shutdown()


# -- GPUFlex: averaging peer (the repo's venv) -------------------------------------------------


class TreePeer:
    """One MeshNode doing a round's reduce and model fetch for a bare vector."""

    def __init__(self, node: Any, index: int, seed: int, size: int) -> None:
        import trio

        from aggregation.weighted import WeightedAccumulator

        self.node, self.index, self.seed, self.size = node, index, seed, size
        self.trial = -1
        self.members: list[str] = []
        self.parent: dict[str, str | None] = {}
        self.acc = WeightedAccumulator(size)
        self.expected: set[str] = set()
        self.reported: set[str] = set()
        self.children_in = trio.Event()
        self.announced = trio.Event()
        self.digest = ""
        self.vector = np.zeros(0, dtype=np.float32)
        node.handlers.register(VEC_KIND, self.on_vector, max_payload=4 * size)
        node.handlers.register(AVG_KIND, self.on_average)

    def prepare(self, trial: int, members: list[str]) -> None:
        import trio

        from aggregation.tree import build_tree, children
        from aggregation.weighted import WeightedAccumulator

        if self.digest:  # last trial's average: every peer has it, so nobody still reads it
            self.node.blobs.path(self.digest).unlink(missing_ok=True)
        self.trial, self.members, self.digest = trial, members, ""
        self.parent = build_tree(members, GROUP_SIZE, members[0])
        self.expected, self.reported = set(children(self.parent, self.node.peer_id)), set()
        self.acc = WeightedAccumulator(self.size)
        self.children_in, self.announced = trio.Event(), trio.Event()
        self.vector = vector_for(self.seed, trial, self.index, self.size)

    def _check(self, body: Any, payload: bytes | None) -> None:
        from mesh.blob import blob_hash
        from mesh.codec import WireError
        from mesh.messaging import Rejected

        if not isinstance(body, dict):
            raise WireError("garbled", "benchmark message without a body")
        if body.get("trial") != self.trial:  # late, from a failed trial: no fault of the sender
            raise Rejected("message for another trial")
        if payload is not None and blob_hash(payload) != body.get("hash"):
            raise WireError("hash", "vector does not match its signed hash")

    async def on_vector(self, msg: Any) -> None:
        """A child's vector or partial, folded the moment it lands, as a leader's collector does."""
        from gpuflex.node.core.modelblob import unpack_delta
        from mesh.codec import WireError

        body = msg.envelope.body
        self._check(body, msg.payload)
        sender = msg.envelope.sender
        if sender not in self.expected or sender in self.reported or msg.payload is None:
            raise WireError("round", f"unexpected vector from {sender[-8:]}")
        self.acc.add(unpack_delta(msg.payload, self.size), float(body["weight"]))
        self.reported.add(sender)
        if self.reported == self.expected:
            self.children_in.set()

    async def on_average(self, msg: Any) -> None:
        self._check(msg.envelope.body, None)
        if msg.envelope.sender == self.members[0]:
            self.digest = str(msg.envelope.body["hash"])
            self.announced.set()

    async def run(self, start_at: float) -> np.ndarray:
        """From ``start_at`` until this peer holds the average; returns it."""
        import trio

        from gpuflex.node.core.modelblob import pack_delta, unpack_delta
        from mesh.blob import blob_hash
        from mesh.codec import seal

        await trio.sleep(max(0.0, start_at - time.time()))
        me = self.node.identity
        with trio.fail_after(TRIAL_TIMEOUT_S):
            self.acc.add(self.vector, 1.0)
            if self.expected:
                await self.children_in.wait()
            up = self.parent[self.node.peer_id]
            if up is None:
                average = self.acc.result()
                self.digest = self.node.blobs.put(pack_delta(average))
                await self.node.broadcast(seal(me, AVG_KIND, {"trial": self.trial, "hash": self.digest}))
                return average
            payload = pack_delta(self.acc.result())
            frame = seal(me, VEC_KIND, {"trial": self.trial, "weight": self.acc.total_weight,
                                        "hash": blob_hash(payload)})
            await self.node.request(up, frame, payload, timeout=TRIAL_TIMEOUT_S)
            await self.announced.wait()
            await self.node.fetch_blob(self.digest, [self.members[0]], timeout=TRIAL_TIMEOUT_S)
            return unpack_delta(self.node.blobs.read(self.digest, verify=True), self.size)


async def gpuflex_avg_peer(channel: Channel, args: dict[str, Any]) -> None:
    from mesh.codec import register_kind
    from mesh.identity import Identity
    from mesh.node import MeshConfig, MeshNode

    register_kind(VEC_KIND, 4096)
    register_kind(AVG_KIND, 4096)
    config = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=[args["bootstrap"]] if args["bootstrap"] else [],
                        data_dir=Path(args["scratch"]) / "node")
    async with MeshNode.start(Identity.generate(), config) as node:
        peer = TreePeer(node, int(args["index"]), int(args["seed"]), int(args["size"]))
        channel.send({"addr": node.multiaddrs()[0], "peer": node.peer_id})
        while (cmd := await channel.recv(600)) is not None:
            if cmd["cmd"] == "alive":
                channel.send({"alive": len(node.peers.alive())})
            elif cmd["cmd"] == "prepare":
                peer.prepare(int(cmd["trial"]), list(cmd["members"]))
                channel.send({})
            elif cmd["cmd"] == "go":
                try:
                    result = await peer.run(float(cmd["start_at"]))
                except Exception as exc:  # a failed trial is a result too; the next one starts afresh
                    channel.send({"failed": f"{exc.__class__.__name__}: {exc}"})
                    continue
                done_at = time.time()
                channel.send({"done_at": done_at, "max_error": max_error(result, peer.seed, peer.trial,
                                                                        len(peer.members))})


ROLES: dict[str, tuple[Callable[..., Any], bool]] = {
    "hm-dht-host": (hivemind_dht_host, True),
    "hm-avg-peer": (hivemind_avg_peer, True),
    "avg-peer": (gpuflex_avg_peer, False),
}


# -- coordinator: DHT --------------------------------------------------------------------------


def _dht_side(mesh: dict[str, Any]) -> dict[str, Any]:
    """The store and get figures of one dht_lookup mesh result."""
    rows = {r["key"]: r for r in mesh["rows"]}
    get, direct = rows["get_value"], rows["direct_request"]
    return {
        "settled": mesh["settled"], "settle_s": mesh["settle_s"], "rt_median": mesh["routing_table_median"],
        "put_count": mesh["put_count"], "put_success_pct": mesh["put_success_pct"],
        "put_p50_ms": mesh["put_p50_ms"], "put_p95_ms": mesh["put_p95_ms"],
        "get_count": get["count"], "get_success_pct": get["success_pct"], "get_local_pct": get["local_pct"],
        "get_p50_ms": get["p50_ms"], "get_p95_ms": get["p95_ms"],
        "direct_success_pct": direct["success_pct"], "direct_p50_ms": direct["p50_ms"],
        "ops": f"{mesh['ops_done']}/{mesh['ops_planned']}",
    }


class TreeMemory:
    """Peak memory of this process's descendants (workers and their p2pd daemons), sampled
    by a thread every ``interval`` seconds: proportional set size where the kernel reports
    it, so pages that processes share are not counted twice."""

    def __init__(self, interval: float = 2.0) -> None:
        self.interval, self.peak_mb = interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def descendants_mb() -> float:
        parent: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        ours, grew = {os.getpid()}, True
        while grew:
            found = {pid for pid, ppid in parent.items() if ppid in ours} - ours
            ours |= found
            grew = bool(found)
        kb = 0
        for pid in ours - {os.getpid()}:
            with contextlib.suppress(OSError, ValueError, IndexError):
                lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                kb += int(next(line for line in lines if line.startswith("Pss:")).split()[1])
        return kb / 1024

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_mb = max(self.peak_mb, self.descendants_mb())

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return math.inf


def _reason(exc: BaseException) -> str:
    """One line for a failed run: the first line of the worker's error, which names the
    exceptions that failed (the log tail quoted after it is left out)."""
    return (str(exc).splitlines() or [exc.__class__.__name__])[0][:300]


def compare_dht(sizes: list[int], per_process: int, budget_s: float, seed: int, python: str) -> list[dict[str, Any]]:
    """Both DHTs at each size, smallest first; a size whose memory, extrapolated from the
    system's smaller run, would not fit in what the machine has free is skipped, and says so."""
    from benchmarks import dht_lookup  # trio and libp2p: this venv's, not hivemind's

    def hivemind_host(index: int, args: dict[str, Any], tmp: Path) -> Worker:
        args = {**args, "op_timeout_s": dht_lookup.OP_TIMEOUT_S, "put_timeout_s": dht_lookup.PUT_TIMEOUT_S}
        return Worker("vs_hivemind", "hm-dht-host", args, tmp, f"hm-dht-host{index}", python=python)

    rows: list[dict[str, Any]] = []
    per_peer_mb: dict[str, float] = {}
    for n in sorted(sizes):
        for system, spawn in (("GPUFlex", dht_lookup.dht_host), ("hivemind", hivemind_host)):
            row: dict[str, Any] = {"peers": n, "system": system, "processes": math.ceil(n / per_process),
                                   "load_before": os.getloadavg()[0]}
            rows.append(row)
            need, free = per_peer_mb.get(system, 0.0) * n * 1.2, _available_mb() - MEMORY_MARGIN_MB
            if need > free:
                row["error"] = (f"not run: ~{need / 1024:.1f} GB needed ({per_peer_mb[system]:.0f} MB per peer "
                                f"measured), {free / 1024:.1f} GB free")
                log(f"DHT, {n} peers, {system}: {row['error']}")
                continue
            log(f"DHT, {n} peers: {system}")
            try:
                with TreeMemory() as memory:
                    row.update(_dht_side(dht_lookup.run_mesh(n, per_process, 1, LOOKUPS, seed, budget_s,
                                                             spawn=spawn)))
            except (WorkerError, TimeoutError, OSError) as exc:
                row["error"] = _reason(exc)
                log(f"DHT, {n} peers, {system}: FAILED: {row['error']}")
            row.update(load_after=os.getloadavg()[0], mb_per_peer=memory.peak_mb / n)
            per_peer_mb[system] = max(per_peer_mb.get(system, 0.0), row["mb_per_peer"])
    return rows


def dht_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for n in sorted({r["peers"] for r in rows}):
        ours, theirs = (next(r for r in rows if r["peers"] == n and r["system"] == s) for s in ("GPUFlex", "hivemind"))
        out.append({"peers": n, **{f"{k}_ratio": ratio(ours.get(k, math.nan), theirs.get(k, math.nan))
                                   for k in ("put_p50_ms", "get_p50_ms", "get_p95_ms", "get_success_pct")}})
    return out


# -- coordinator: averaging --------------------------------------------------------------------


def _start_peers(n: int, spawn: Callable[[int, dict[str, Any]], Worker], started: list[Worker]) -> tuple[
        list[Worker], list[str]]:
    """Peer 0 first, then the rest bootstrapped from it; returns the workers and peer ids."""
    peers = [spawn(0, {"bootstrap": ""})]
    started.append(peers[0])
    first = peers[0].recv(START_TIMEOUT_S)
    for i in range(1, n):
        peers.append(spawn(i, {"bootstrap": first["addr"]}))
        started.append(peers[-1])
    return peers, [first["peer"]] + [w.recv(START_TIMEOUT_S)["peer"] for w in peers[1:]]


def _ask_all(peers: list[Worker], message: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    for w in peers:
        w.send(message)
    return [w.recv(timeout) for w in peers]


def _wait_connected(peers: list[Worker]) -> None:
    """Until every GPUFlex peer counts all others as up, so the result's gossip reaches all."""
    def connected() -> bool:
        return min(r["alive"] for r in _ask_all(peers, {"cmd": "alive"}, 30)) >= len(peers) - 1

    wait_until(connected, CONNECT_TIMEOUT_S, 1.0, "GPUFlex peers to see each other")


def _trial(peers: list[Worker], trial: int, members: list[str]) -> dict[str, Any]:
    """One trial on every peer; a peer's ``failed`` reply fails the trial, not the run."""
    prepared = _ask_all(peers, {"cmd": "prepare", "trial": trial, "members": members}, MATCHMAKING_TIMEOUT_S + 60)
    failed = [r["failed"] for r in prepared if "failed" in r]
    if not failed:
        start_at = time.time() + START_LEAD_S
        done = _ask_all(peers, {"cmd": "go", "trial": trial, "start_at": start_at}, TRIAL_TIMEOUT_S + 60)
        failed = [r["failed"] for r in done if "failed" in r]
    if failed:
        return {"failed": failed[0]}
    return {"wall_s": max(float(r["done_at"]) for r in done) - start_at,
            "first_s": min(float(r["done_at"]) for r in done) - start_at,
            "max_error": max(float(r["max_error"]) for r in done),
            "matchmaking_s": max((float(r.get("matchmaking_s", math.nan)) for r in prepared), default=math.nan)}


def _median_trial(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the trials that succeeded (NaN, shown as "-", when none did). A trial
    whose average is off counts as succeeded (its time is real) and is named in ``correct``:
    when the exchange with a peer fails, hivemind keeps its own values for that peer's part
    (logged at debug level) and reports the step as done."""
    if not ok:
        return {"correct": "-"}
    exact = sum(s["max_error"] <= MAX_ERROR for s in ok)
    return {"wall_s": statistics.median(s["wall_s"] for s in ok), "best_s": min(s["wall_s"] for s in ok),
            "first_s": statistics.median(s["first_s"] for s in ok), "max_error": max(s["max_error"] for s in ok),
            "correct": "yes" if exact == len(ok) else f"NO: {exact}/{len(ok)} exact",
            "matchmaking_s": statistics.median(s["matchmaking_s"] for s in ok)}


def compare_averaging(sizes: list[int], params: int, trials: int, seed: int, python: str) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        with workers(f"avg{n}") as (tmp, started):
            def ours(i: int, args: dict[str, Any], n: int = n) -> Worker:
                return Worker("vs_hivemind", "avg-peer", {**args, "index": i, "peers": n, "size": params, "seed": seed},
                              tmp, f"gpuflex{i}")

            def theirs(i: int, args: dict[str, Any], n: int = n) -> Worker:
                return Worker("vs_hivemind", "hm-avg-peer", {**args, "index": i, "peers": n, "size": params,
                                                             "seed": seed}, tmp, f"hivemind{i}", python=python)

            log(f"averaging, {n} peers: starting GPUFlex and hivemind peers")
            sides = {"GPUFlex": _start_peers(n, ours, started), "hivemind": _start_peers(n, theirs, started)}
            _wait_connected(sides["GPUFlex"][0])
            samples: dict[str, list[dict[str, Any]]] = {"GPUFlex": [], "hivemind": []}
            load = os.getloadavg()[0]
            for t in range(trials):
                for system in (("hivemind", "GPUFlex") if t % 2 == 0 else ("GPUFlex", "hivemind")):
                    peers, ids = sides[system]
                    s = _trial(peers, t, ids)
                    samples[system].append(s)
                    log(f"averaging, {n} peers, {system}, trial {t + 1}: " + (
                        f"FAILED: {s['failed']}" if "failed" in s else
                        f"{s['wall_s']:.2f}s, max error {s['max_error']:.1e}"))
            for system, got in samples.items():
                ok = [s for s in got if "failed" not in s]
                rows.append({"peers": n, "system": system, "trials": f"{len(ok)}/{len(got)}",
                             **_median_trial(ok), "load_before": load, "load_after": os.getloadavg()[0],
                             "error": next((s["failed"] for s in got if "failed" in s), None)})
    return rows


def averaging_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for n in sorted({r["peers"] for r in rows}):
        ours, theirs = (next(r for r in rows if r["peers"] == n and r["system"] == s) for s in ("GPUFlex", "hivemind"))
        out.append({"peers": n, "wall_ratio": ratio(ours.get("wall_s", math.nan), theirs.get("wall_s", math.nan)),
                    "best_ratio": ratio(ours.get("best_s", math.nan), theirs.get("best_s", math.nan))})
    return out


# -- output ------------------------------------------------------------------------------------


def _short(rows: list[dict[str, Any]], width: int = 110) -> list[dict[str, Any]]:
    """Rows with their error cut to ``width`` characters for the table (JSON keeps it whole)."""
    return [{**r, "error": r["error"][:width] + "…" if len(r.get("error") or "") > width else r.get("error")}
            for r in rows]


def render(result: dict[str, Any]) -> str:
    lines = [f"GPUFlex against {HIVEMIND} (torch {TORCH_PIN.split('==')[1]} CPU), 127.0.0.1, {os.cpu_count()} cores"]
    if result["dht"]:
        lines += [
            "", f"DHT: one value stored per peer (all peers at once), then {LOOKUPS} gets of values stored by "
            f"others per peer, one in flight per hosting process, within {result['budget_s']:.0f}s; "
            f"{result['per_process']} peers per process; direct = a request to the value's owner in the same run",
            format_table(_short(result["dht"]), [
                ("peers", "peers", ""), ("system", "system", ""), ("put_success_pct", "store ok %", ".1f"),
                ("put_p50_ms", "store p50 ms", ".0f"), ("put_p95_ms", "store p95 ms", ".0f"),
                ("get_count", "gets", "d"), ("get_success_pct", "get ok %", ".1f"), ("get_p50_ms", "get p50 ms", ".0f"),
                ("get_p95_ms", "get p95 ms", ".0f"), ("direct_success_pct", "direct ok %", ".1f"),
                ("direct_p50_ms", "direct p50 ms", ".0f"), ("rt_median", "routing table", ""),
                ("get_local_pct", "gets held locally %", ".0f"), ("mb_per_peer", "MB per peer", ".0f"),
                ("ops", "ops run", ""), ("load_after", "load avg", ".1f"), ("error", "error", "")]),
            "", "DHT ratios, GPUFlex / hivemind (latency below 1: GPUFlex faster; "
                "success above 1: GPUFlex more reliable)",
            format_table(result["dht_ratios"], [
                ("peers", "peers", ""), ("put_p50_ms_ratio", "store p50", ".2f"),
                ("get_p50_ms_ratio", "get p50", ".2f"),
                ("get_p95_ms_ratio", "get p95", ".2f"), ("get_success_pct_ratio", "get success", ".2f")]),
        ]
    if result["averaging"]:
        lines += [
            "", f"Averaging {result['params']:,} float32 parameters: wall time from a common start until every "
            f"peer holds the average (median of {result['trials']} trials, alternating systems); max error "
            "against the exact mean; hivemind's matchmaking done beforehand and shown apart",
            format_table(_short(result["averaging"]), [
                ("peers", "peers", ""), ("system", "system", ""), ("trials", "trials ok", ""),
                ("wall_s", "all hold it s", ".2f"), ("best_s", "best s", ".2f"), ("first_s", "first holds it s", ".2f"),
                ("max_error", "max error", ".1e"), ("correct", "correct", ""),
                ("matchmaking_s", "matchmaking s", ".2f"), ("load_after", "load avg", ".1f"), ("error", "error", "")]),
            "", "Averaging ratios, GPUFlex / hivemind (below 1: GPUFlex faster)",
            format_table(result["averaging_ratios"], [
                ("peers", "peers", ""), ("wall_ratio", "median", ".2f"), ("best_ratio", "best", ".2f")]),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dht-peers", type=int, nargs="*", default=[64, 256], help="DHT sizes (none: skip)")
    parser.add_argument("--avg-peers", type=int, nargs="*", default=[4, 8], help="averaging sizes (none: skip)")
    parser.add_argument("--params", type=int, default=10_000_000, help="float32 parameters averaged")
    parser.add_argument("--trials", type=int, default=3, help="averaging trials per system and size")
    parser.add_argument("--per-process", type=int, default=16, help="DHT peers hosted per process")
    parser.add_argument("--budget-s", type=float, default=90.0, help="time for DHT gets per mesh")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 DHT peers, 4 averaging peers, 1M parameters")
    add_json_flag(parser)
    add_role_flag(parser)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    if args.role:
        role, on_asyncio = ROLES[args.role]
        if on_asyncio:
            run_asyncio_worker(role, args.role_args)
        else:
            from benchmarks.common import run_worker

            run_worker(role, args.role_args, WORKER_DEADLINE_S)
        return
    if args.quick:
        args.dht_peers, args.avg_peers, args.params, args.trials, args.budget_s = [8], [4], 1_000_000, 1, 10.0
    if min(args.dht_peers + args.avg_peers, default=2) < 2 or args.params < 1 or args.trials < 1:
        parser.error("peer counts must be ≥ 2; --params and --trials ≥ 1")
    try:
        python = hivemind_python()
    except (SideVenvError, OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"vs_hivemind: could not set up hivemind's venv: {exc}") from None
    dht = compare_dht(args.dht_peers, args.per_process, args.budget_s, args.seed, python) if args.dht_peers else []
    avg = compare_averaging(args.avg_peers, args.params, args.trials, args.seed, python) if args.avg_peers else []
    emit({"benchmark": "vs_hivemind", "hivemind": HIVEMIND, "budget_s": args.budget_s, "per_process": args.per_process,
          "params": args.params, "trials": args.trials, "dht": dht, "dht_ratios": dht_ratios(dht) if dht else [],
          "averaging": avg, "averaging_ratios": averaging_ratios(avg) if avg else []}, args.json, render)


if __name__ == "__main__":
    main()
