"""The product's own mesh and round code at 16 to 1,000 nodes, simulated in one process.

Every node is a real ``MeshNode`` and ``JobManager`` (``gpuflex.testing.sim``) on a modelled
network (``mesh.testing.simnet``: per-link latency, per-node up/down bandwidth, public and
private nodes, churn), under ``trio.testing.MockClock``; only the sockets and the trainer are
stand-ins. For each mesh size it reports, per node per modelled second while idle, messages
(writes), bytes and connections; per round, its modelled time, its contributors and the bytes
through the busiest node; and the wall-clock seconds the simulation took.

Run:

    python -m benchmarks.scale [--nodes 16 100 200 1000] [--rounds 5] [--json]
    python -m benchmarks.scale --nodes 200 --public 0.1 --update-mb 10 --up-mbit 20
    python -m benchmarks.scale --nodes 200 --crash 3 --crash-at 20   # failure detection
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio
import trio.testing

from benchmarks.common import add_json_flag, emit, log
from gpuflex.testing.sim import ChurnEvent, ChurnKind, SimConfig, simulation


async def one(cfg: SimConfig) -> dict[str, Any]:
    async with simulation(cfg) as sim:
        return await sim.run(progress=log)


def run_size(cfg: SimConfig) -> dict[str, Any]:
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # a thousand nodes' routine warnings are noise here
    wall, cpu = time.perf_counter(), time.process_time()
    report = trio.run(one, cfg, clock=trio.testing.MockClock(autojump_threshold=0))
    report["wall_s"] = round(time.perf_counter() - wall, 1)
    report["cpu_s"] = round(time.process_time() - cpu, 1)  # what a shared, loaded machine cannot inflate
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[16, 100, 200])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--public", type=float, default=1.0, help="fraction of public nodes")
    ap.add_argument("--up-mbit", type=float, default=20.0, help="uplink of a private node (public: 10x)")
    ap.add_argument("--down-mbit", type=float, default=100.0)
    ap.add_argument("--update-mb", type=float, default=0.0625)
    ap.add_argument("--compute-s", type=float, default=2.0)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--slow", type=float, default=0.0, help="fraction of nodes at a quarter speed")
    ap.add_argument("--crash", type=int, default=0, help="nodes to crash (silently) during the job")
    ap.add_argument("--crash-at", type=float, default=15.0, help="modelled seconds after the job starts")
    ap.add_argument("--seed", type=int, default=0)
    add_json_flag(ap)
    args = ap.parse_args(argv)
    results = []
    for n in args.nodes:
        churn = [ChurnEvent(args.crash_at, ChurnKind.CRASH, n - 1 - i) for i in range(min(args.crash, n - 2))]
        cfg = SimConfig(nodes=n, rounds=args.rounds, public_fraction=args.public, up_mbit=args.up_mbit,
                        down_mbit=args.down_mbit, update_bytes=int(args.update_mb * 1e6), compute_s=args.compute_s,
                        group_size=args.group_size, slow_fraction=args.slow, seed=args.seed, churn=churn)
        log(f"{n} nodes …")
        report = run_size(cfg)
        idle = report["idle_per_node_s"]
        log(f"{n} nodes: {report['rounds_committed']}/{args.rounds} rounds in {report['wall_s']} s wall, "
            f"{report['cpu_s']} s CPU; "
            f"idle {idle['msgs']:.1f} msgs/s, {idle['bytes'] / 1e3:.1f} kB/s per node; "
            f"{report['connections_per_node']['mean']:.0f} connections per node")
        log(f"  gossip: {report['gossip']}; crashed nodes down everywhere after {report['detection_s']} s "
            f"(never: {report['crashed_undetected']})")
        for r in report["rounds"]:
            log(f"  round {r['round']}: {r['seconds']} s, {r['contributors']} contributors, "
                f"busiest node {r['busiest_bytes'] / 1e6:.1f} MB")
        results.append(report)
    emit({"sizes": results}, args.json, lambda r: "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
