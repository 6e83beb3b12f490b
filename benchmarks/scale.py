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
    python -m benchmarks.scale --nodes 1000 --homes-in /var/tmp      # homes on disk, not in memory
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio
import trio.testing

from benchmarks.common import add_json_flag, emit, log
from gpuflex.testing.sim import ChurnEvent, ChurnKind, SimConfig, quiet_gc, simulation


async def one(cfg: SimConfig) -> dict[str, Any]:
    async with simulation(cfg) as sim:
        return await sim.run(progress=log)


def run_size(cfg: SimConfig) -> dict[str, Any]:
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # a thousand nodes' routine warnings are noise here
    wall, cpu = time.perf_counter(), time.process_time()
    with quiet_gc():
        report = trio.run(one, cfg, clock=trio.testing.MockClock(autojump_threshold=0))
    report["wall_s"] = round(time.perf_counter() - wall, 1)
    report["cpu_s"] = round(time.process_time() - cpu, 1)  # what a shared, loaded machine cannot inflate
    return report


def tree_bound_s(cfg: SimConfig, levels: int) -> float:
    """The least time a round can take on the tree's links alone, for updates of
    ``cfg.update_bytes``: the compute time; then, level by level up the tree, the slower of a
    child's upload on its uplink and a leader's ``group_size - 1`` children arriving on its
    downlink (bottom-level children on a home uplink when any member is private, leaders on
    public links); then the new model back down, each level a leader sending it to its
    ``group_size - 1`` children on its uplink. Latency, signatures and plan messages are left
    out: a real round can only be slower."""
    bits = cfg.update_bytes * 8
    pub_up, pub_down = cfg.up_mbit * 10e6, cfg.down_mbit * 10e6
    home_up = cfg.up_mbit * 1e6 if cfg.public_fraction < 1 else pub_up
    fan = max(1, cfg.group_size - 1)
    up = sum(max(bits / (home_up if level == 0 else pub_up), fan * bits / pub_down) for level in range(levels))
    down = levels * fan * bits / pub_up
    return cfg.compute_s + up + down


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
    ap.add_argument("--kill", type=int, default=0, help="nodes to kill (their connections close at once)")
    ap.add_argument("--crash-at", type=float, default=15.0, help="modelled seconds after the job starts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--homes-in", default=None,
                    help="folder for the node homes (default /dev/shm; a disk folder for 1,000 nodes of large rounds)")
    add_json_flag(ap)
    args = ap.parse_args(argv)
    results = []
    for n in args.nodes:
        churn = [ChurnEvent(args.crash_at, ChurnKind.CRASH, n - 1 - i) for i in range(min(args.crash, n - 2))]
        churn += [ChurnEvent(args.crash_at, ChurnKind.LEAVE, n - 1 - args.crash - i)
                  for i in range(min(args.kill, n - 2 - args.crash))]
        cfg = SimConfig(nodes=n, rounds=args.rounds, public_fraction=args.public, up_mbit=args.up_mbit,
                        down_mbit=args.down_mbit, update_bytes=int(args.update_mb * 1e6), compute_s=args.compute_s,
                        group_size=args.group_size, slow_fraction=args.slow, seed=args.seed, churn=churn,
                        homes_in=args.homes_in)
        log(f"{n} nodes …")
        report = run_size(cfg)
        idle = report["idle_per_node_s"]
        log(f"{n} nodes: {report['rounds_committed']}/{args.rounds} rounds in {report['wall_s']} s wall, "
            f"{report['cpu_s']} s CPU; "
            f"idle {idle['msgs']:.1f} msgs/s, {idle['bytes'] / 1e3:.1f} kB/s per node; "
            f"{report['connections_per_node']['mean']:.0f} connections per node; "
            f"CPU s by phase {report['cpu_s_by_phase']}")
        log(f"  idle stream writes per node per second, by protocol: {report['idle_writes_by_protocol']}")
        job = report.get("job_per_node_s")
        if job:
            log(f"  during the job: {job['msgs']:.1f} msgs/s, {job['bytes'] / 1e3:.1f} kB/s per node")
        log(f"  gossip: {report['gossip']}; crashed nodes down everywhere after {report['detection_s']} s "
            f"(never: {report['crashed_undetected']})")
        for r in report["rounds"]:
            r["bound_s"] = round(tree_bound_s(cfg, r.get("depth") or 1), 2)
            log(f"  round {r['round']}: {r['seconds']} s (tree's bandwidth bound {r['bound_s']} s), "
                f"{r['contributors']} contributors, busiest node {r['busiest_bytes'] / 1e6:.1f} MB; "
                f"tree of {r.get('members')} in {r.get('depth')} levels, at most {r.get('max_children')} children; "
                f"member-to-leader RTT {r.get('rtt_to_leader_ms')} ms (plain order: {r.get('rtt_plain_ms')} ms)")
        results.append(report)
    emit({"sizes": results}, args.json, lambda r: "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
