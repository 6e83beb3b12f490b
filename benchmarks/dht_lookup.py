"""DHT lookup latency and success rate in meshes of 32 and 64 MeshNodes on loopback.

GPUFlex finds jobs, peers and NodeInfo records through py-libp2p's Kademlia DHT, so what a
lookup costs, and how often it fails, bounds how fast a mesh forms and a job spreads. Sixty-four
libp2p processes do not fit on two cores, so the nodes are hosted ``--per-process`` (16) to a
trio process, all bootstrapped from node 0. Once routing tables stop growing, every node
stores K values under ``/bench/<node>-<j>`` and then, one operation in flight per hosting
process, looks up values stored by others (``get_value``), looks up other peers
(``find_peer``, and the iterative FIND_NODE walk it falls back to) and, as the baseline
measured in the same run, sends a direct request to the peer that stored the value.

With k = 20 and a few dozen nodes many values and most peers are already known locally;
a lookup answered from the local store or routing table costs almost nothing, so those are
counted and reported apart from the ones that went to the network. Run:

    python -m benchmarks.dht_lookup [--nodes 32 64] [--keys 1] [--lookups 4] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import (
    Channel,
    Stopwatch,
    Worker,
    add_json_flag,
    add_role_flag,
    emit,
    format_table,
    log,
    percentile,
    ratio,
    run_in_turns,
    run_worker,
    stop_on_sigterm,
    wait_until,
    workers,
)

NAMESPACE = "bench"
PING_KIND = "bench_ping"
OP_TIMEOUT_S = 10.0
PUT_TIMEOUT_S = 30.0
WORKER_DEADLINE_S = 1800.0
SETTLE_POLL_S = 3.0
SETTLE_STABLE_POLLS = 5
SETTLE_TIMEOUT_S = 90.0
OPS = ("get_value", "find_peer", "find_node_walk", "direct_request")
OP_LABELS = {
    "get_value": "get_value (value stored by another node)",
    "find_peer": "find_peer",
    "find_node_walk": "iterative FIND_NODE walk",
    "direct_request": "direct request (baseline)",
}


# -- worker: many MeshNodes in one trio process ------------------------------------------------


class _AnyBytes:
    """Validator for the benchmark's own namespace; the mesh is strict about namespaces."""

    def validate(self, key: str, value: bytes) -> None:
        if not value:
            raise ValueError("empty benchmark record")

    def select(self, key: str, values: list[bytes]) -> int:
        return 0


def _known_locally(node: Any, peer: str) -> bool:
    """Whether find_peer can answer without the network (routing table or peerstore)."""
    from libp2p.peer.id import ID

    pid = ID.from_base58(peer)
    if node.dht.routing_table.get_peer_info(pid) is not None:
        return True
    try:
        return bool(node.host.get_peerstore().addrs(pid))
    except Exception:
        return False


async def _timed(op: str, local: bool, coro_fn: Any, check: Any, timeout: float = OP_TIMEOUT_S) -> dict[str, Any]:
    """Run one operation under ``timeout``; a timeout or exception counts as a failure."""
    ok = False
    with Stopwatch() as sw, trio.move_on_after(timeout), contextlib.suppress(Exception):
        ok = bool(check(await coro_fn()))
    log(f"{op}: {'ok' if ok else 'FAILED'} in {sw.seconds * 1000:.0f} ms{' (local)' if local else ''}")
    return {"op": op, "local": local, "ok": ok, "ms": sw.seconds * 1000}


class Host:
    """``count`` MeshNodes sharing this process; indexes are global across all hosts."""

    def __init__(self, first: int, count: int, bootstrap: str, scratch: Path) -> None:
        self.first, self.count, self.bootstrap, self.scratch = first, count, bootstrap, scratch
        self.nodes: list[Any] = []

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        from mesh.codec import register_kind
        from mesh.health import HealthConfig
        from mesh.identity import Identity
        from mesh.node import MeshConfig, MeshNode

        register_kind(PING_KIND, 1024)
        # Pings between co-hosted nodes only burn the shared cores; the DHT does not use them.
        health = HealthConfig(ping_interval_s=30.0, ping_timeout_s=5.0, suspect_after_s=90.0, down_after_s=180.0)
        for i in range(self.first, self.first + self.count):
            boot = [self.bootstrap] if self.bootstrap else []
            if not boot and self.nodes:
                boot = [self.nodes[0].multiaddrs()[0]]
            config = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=boot, health=health,
                                data_dir=self.scratch / f"node{i}")
            node = await stack.enter_async_context(MeshNode.start(Identity.generate(), config))
            node.dht.validator.add_validator(NAMESPACE, _AnyBytes())

            async def pong(msg: Any) -> None:
                return None

            node.handlers.register(PING_KIND, pong)
            self.nodes.append(node)

    def indexed(self) -> list[tuple[int, Any]]:
        return list(enumerate(self.nodes, start=self.first))

    async def put(self, keys_per_node: int) -> dict[str, Any]:
        """Every hosted node stores its values, all nodes at once: this is setup, and one
        at a time it takes minutes, since py-libp2p's put_value waits on its slowest store."""
        owners: dict[str, str] = {}
        samples: list[dict[str, Any]] = []

        async def put_all(i: int, node: Any) -> None:
            for j in range(keys_per_node):
                key = f"/{NAMESPACE}/{i}-{j}"
                value = f"{node.peer_id}:{j}".encode()
                samples.append(await _timed("put_value", False, lambda k=key, v=value: node.dht.put_value(k, v),
                                            lambda _: True, PUT_TIMEOUT_S))
                owners[key] = node.peer_id

        async with trio.open_nursery() as nursery:
            for i, node in self.indexed():
                nursery.start_soon(put_all, i, node)
        return {"owners": owners, "samples": samples}

    async def lookup(self, owners: dict[str, str], peers: list[str], lookups: int, seed: int,
                     budget_s: float) -> dict[str, Any]:
        """Per node: get_value of others' values, a direct request to each value's owner,
        find_peer and the FIND_NODE walk for random other peers.

        Operations run one at a time, round-robin over the hosted nodes, until ``budget_s``
        is spent: on an overloaded machine every node still gets its turn, and the run ends.
        """
        from libp2p.peer.id import ID

        from mesh.codec import seal

        rng = random.Random(seed * 1_000 + self.first)
        per_node: list[list[list[Any]]] = []
        held_share: list[float] = []
        for _, node in self.indexed():
            theirs = sorted(k for k, owner in owners.items() if owner != node.peer_id)
            remote = [k for k in theirs if node.dht.value_store.get(k.encode()) is None]
            held_share.append(1.0 - len(remote) / max(1, len(theirs)))
            # A value this node already holds costs a dict lookup; measure the ones it must fetch.
            keys = rng.sample(remote or theirs, min(lookups, len(remote or theirs)))
            others = rng.sample([p for p in peers if p != node.peer_id], min(lookups, len(peers) - 1))
            ops: list[list[Any]] = []
            for key, peer in zip(keys, others, strict=False):
                pid, expected = ID.from_base58(peer), f"{owners[key]}:".encode()
                frame = seal(node.identity, PING_KIND, {})
                ops.append([
                    lambda n=node, k=key, e=expected, held=not remote: _timed(
                        "get_value", held, lambda: n.dht.get_value(k),
                        lambda v: isinstance(v, bytes) and v.startswith(e)),
                    lambda n=node, o=owners[key], f=frame: _timed(
                        "direct_request", False, lambda: n.request(o, f, timeout=OP_TIMEOUT_S), lambda _: True),
                    lambda n=node, p=pid, text=peer: _timed(
                        "find_peer", _known_locally(n, text), lambda: n.dht.find_peer(p),
                        lambda info: info is not None and info.peer_id == p),
                    lambda n=node, p=pid: _timed(
                        "find_node_walk", False, lambda: n.dht.peer_routing.find_closest_peers_network(p.to_bytes()),
                        lambda found: p in found),
                ])
            per_node.append(ops)
        samples, planned = await run_in_turns(per_node, budget_s)
        return {"samples": samples, "held_share": held_share, "planned": planned}


async def host_worker(channel: Channel, args: dict[str, Any]) -> None:
    """Host a slice of the mesh and answer the coordinator's phase commands."""
    host = Host(int(args["first"]), int(args["count"]), str(args["bootstrap"]), Path(args["scratch"]))
    async with contextlib.AsyncExitStack() as stack:
        await host.start(stack)
        channel.send({"addr": host.nodes[0].multiaddrs()[0], "peers": [n.peer_id for n in host.nodes]})
        while (cmd := await channel.recv(600)) is not None:
            if cmd["cmd"] == "rt":
                channel.send({"sizes": [n.dht.get_routing_table_size() for n in host.nodes]})
            elif cmd["cmd"] == "put":
                channel.send(await host.put(int(cmd["keys"])))
            elif cmd["cmd"] == "lookup":
                channel.send(await host.lookup(cmd["owners"], cmd["peers"], int(cmd["lookups"]),
                                               int(cmd["seed"]), float(cmd["budget_s"])))
            else:
                channel.send({"error": f"unknown command {cmd['cmd']!r}"})


ROLES = {"dht-host": host_worker}


# -- coordinator -------------------------------------------------------------------------------


def _settle(hosts: list[Worker], timeout: float) -> tuple[list[int], float, bool]:
    """Poll routing-table sizes until they stop growing (bounded by ``timeout``).

    Tables churn a little as buckets refresh, so "settled" means the total has not passed
    its high-water mark for SETTLE_STABLE_POLLS polls (or every node knows every other).
    Returns the last sizes, the seconds waited and whether they settled; an unsettled mesh is
    still measured, and says so, rather than discarded.
    """
    totals: list[int] = []
    sizes: list[int] = []

    def stable() -> bool:
        sizes[:] = [s for w in hosts for s in w.ask({"cmd": "rt"}, 60)["sizes"]]
        totals.append(sum(sizes))
        if min(sizes) >= len(sizes) - 1:
            return True
        return len(totals) > SETTLE_STABLE_POLLS and max(totals[-SETTLE_STABLE_POLLS:]) <= max(
            totals[:-SETTLE_STABLE_POLLS])

    try:
        waited = wait_until(stable, timeout, SETTLE_POLL_S, "routing tables to settle")
    except TimeoutError:
        return sizes, timeout, False
    return sizes, waited, True


def _summarise(samples: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    rows = []
    for op in OPS:
        chosen = [s for s in samples if s["op"] == op]
        ok_ms = [s["ms"] for s in chosen if s["ok"]]
        rows.append({
            "nodes": n, "op": OP_LABELS[op], "key": op, "count": len(chosen),
            "success_pct": 100.0 * len(ok_ms) / len(chosen) if chosen else math.nan,
            "local_pct": 100.0 * sum(s["local"] for s in chosen) / len(chosen) if chosen else math.nan,
            "p50_ms": percentile(ok_ms, 50), "p95_ms": percentile(ok_ms, 95),
        })
    direct = next(r for r in rows if r["key"] == "direct_request")
    for row in rows:
        row["vs_direct"] = ratio(row["p50_ms"], direct["p50_ms"])
    return rows


def dht_host(index: int, args: dict[str, Any], tmp: Path) -> Worker:
    """A process hosting a slice of a GPUFlex mesh: :func:`run_mesh`'s default ``spawn``."""
    return Worker("dht_lookup", "dht-host", args, tmp, f"dht-host{index}")


def run_mesh(n: int, per_process: int, keys: int, lookups: int, seed: int, budget_s: float,
             spawn: Callable[[int, dict[str, Any], Path], Worker] = dht_host) -> dict[str, Any]:
    """One mesh of ``n`` nodes, started, measured and torn down.

    ``spawn`` starts one hosting process; another DHT measured the same way (hivemind's, in
    vs_hivemind) passes its own, whose workers answer the same commands.
    """
    count = math.ceil(n / per_process)
    with workers(f"dht{n}") as (tmp, started):
        log(f"{n} nodes: starting {count} hosting processes of up to {per_process} nodes")
        bootstrap = ""
        peers: list[str] = []
        for w in range(count):
            first = w * per_process
            args = {"first": first, "count": min(per_process, n - first), "bootstrap": bootstrap}
            started.append(spawn(w, args, tmp))
            if w == 0:  # node 0 must be up before anyone can bootstrap from it
                reply = started[0].recv(180)
                bootstrap, peers = reply["addr"], list(reply["peers"])
        for worker in started[1:]:
            peers += worker.recv(300)["peers"]
        log(f"{n} nodes: all started; waiting for routing tables to settle")
        sizes, settle_s, settled = _settle(started, timeout=SETTLE_TIMEOUT_S)
        log(f"{n} nodes: routing tables {'settled' if settled else 'still growing'} after {settle_s:.0f}s "
            f"(min {min(sizes)}, max {max(sizes)})")
        for worker in started:
            worker.send({"cmd": "put", "keys": keys})
        put_replies = [worker.recv(keys * PUT_TIMEOUT_S + 60) for worker in started]
        owners = {k: v for r in put_replies for k, v in r["owners"].items()}
        put_samples = [s for r in put_replies for s in r["samples"]]
        log(f"{n} nodes: {len(owners)} values stored; looking up")
        for worker in started:
            worker.send({"cmd": "lookup", "owners": owners, "peers": peers, "lookups": lookups, "seed": seed,
                         "budget_s": budget_s})
        replies = [worker.recv(budget_s + OP_TIMEOUT_S + 60) for worker in started]
    samples = [s for r in replies for s in r["samples"]]
    held = [h for r in replies for h in r["held_share"]]
    planned = sum(int(r["planned"]) for r in replies)
    put_ms = [s["ms"] for s in put_samples if s["ok"]]
    return {
        "nodes": n, "hosting_processes": count, "per_process": per_process, "settle_s": settle_s, "settled": settled,
        "routing_table_min": min(sizes), "routing_table_median": sorted(sizes)[len(sizes) // 2],
        "routing_table_max": max(sizes),
        "put_count": len(put_samples), "put_success_pct": 100.0 * len(put_ms) / max(1, len(put_samples)),
        "put_p50_ms": percentile(put_ms, 50), "put_p95_ms": percentile(put_ms, 95),
        "held_locally_pct": 100.0 * sum(held) / max(1, len(held)), "ops_planned": planned, "ops_done": len(samples),
        "rows": _summarise(samples, n),
    }


def run(sizes: list[int], per_process: int, keys: int, lookups: int, seed: int, budget_s: float) -> dict[str, Any]:
    meshes = [run_mesh(n, per_process, keys, lookups, seed, budget_s) for n in sizes]
    return {"benchmark": "dht_lookup", "keys_per_node": keys, "lookups_per_node": lookups, "budget_s": budget_s,
            "meshes": meshes}


def render(result: dict[str, Any]) -> str:
    columns = [("nodes", "nodes", ""), ("op", "operation", ""), ("count", "n", "d"),
               ("success_pct", "success %", ".1f"), ("local_pct", "answered locally %", ".0f"),
               ("p50_ms", "p50 ms", ".1f"), ("p95_ms", "p95 ms", ".1f"), ("vs_direct", "p50 x direct", ".2f")]
    lines = [f"DHT lookups: {result['keys_per_node']} values stored per node, {result['lookups_per_node']} "
             "lookups of each kind per node, one operation in flight per hosting process, 127.0.0.1"]
    rows = []
    for mesh in result["meshes"]:
        lines.append(
            f"{mesh['nodes']} nodes in {mesh['hosting_processes']} trio processes (≤{mesh['per_process']} "
            f"MeshNodes each), all bootstrapped from node 0; routing tables "
            f"{'settled' if mesh['settled'] else 'still growing (timed out)'} after "
            f"{mesh['settle_s']:.0f}s at min/median/max {mesh['routing_table_min']}/"
            f"{mesh['routing_table_median']}/{mesh['routing_table_max']} peers; put_value: "
            f"{mesh['put_success_pct']:.1f}% of {mesh['put_count']} returned (all nodes at once), "
            f"p50 {mesh['put_p50_ms']:.0f} ms, "
            f"p95 {mesh['put_p95_ms']:.0f} ms; {mesh['held_locally_pct']:.0f}% of other nodes' values were "
            "already in a node's own store (k = 20 replication), so lookups use the rest; "
            f"{mesh['ops_done']} of {mesh['ops_planned']} planned operations ran within the "
            f"{result['budget_s']:.0f}s budget")
        rows += mesh["rows"]
    lines.append(format_table(rows, columns))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[32, 64], help="mesh sizes to measure")
    parser.add_argument("--per-process", type=int, default=16, help="MeshNodes hosted per trio process")
    parser.add_argument("--keys", type=int, default=1, help="values each node stores")
    parser.add_argument("--lookups", type=int, default=4, help="lookups of each kind per node")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=120.0, help="time allowed for lookups per mesh")
    add_json_flag(parser)
    add_role_flag(parser)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    if args.role:
        run_worker(ROLES[args.role], args.role_args, WORKER_DEADLINE_S)
        return
    if min(args.nodes) < 2 or args.per_process < 1 or args.keys < 1 or args.lookups < 1:
        parser.error("--nodes must be ≥ 2; --per-process, --keys and --lookups ≥ 1")
    emit(run(args.nodes, args.per_process, args.keys, args.lookups, args.seed, args.budget_s), args.json, render)


if __name__ == "__main__":
    main()
