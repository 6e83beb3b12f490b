"""The largest mesh of real node processes this machine runs the demo job on.

For each size, real ``gpuflex node start`` processes on 127.0.0.1 (forked from one launcher
that imported torch and libp2p once, as ``gpuflex demo`` starts them) find each other from
node 0's address, and node 0 submits the demo job (the digits CNN on Dirichlet shards) for
``--rounds`` rounds, each member's share of work made small (``--local-steps`` batches) so
that the protocol, not the training, is what a 2-core machine is asked to carry, and every
round waiting for all of them (``min_nodes``). Measured:

* whether the mesh settled (every node lists every other as up) and how long it took;
* the rounds committed within ``--timeout-s``, and the contributors and length of each;
* per node process: open file descriptors (max), memory (PSS, summed: forked processes
  share their imports), and CPU-seconds over the job.

Run (sizes one after the other; a size that fails still reports how far it got):

    python -m benchmarks.realmesh [--nodes 8 16 32] [--rounds 5] [--local-steps 2] [--json]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_json_flag, emit, format_table, log, stop_on_sigterm
from benchmarks.procstat import cpu_seconds, open_fds, pss_mb


def job_spec(rounds: int, local_steps: int, nodes: int) -> dict[str, Any]:
    """The demo job, each member's work ``local_steps`` batches, and a round planned only once
    all ``nodes`` are present (``min_nodes``): the question is whether every one contributes."""
    from gpuflex.demo import demo_spec

    spec = demo_spec(rounds)
    spec["local_steps"] = local_steps
    spec["local_epochs"] = 1
    spec["min_nodes"] = nodes
    return spec


def measure(nodes: int, rounds: int, local_steps: int, timeout_s: float) -> dict[str, Any]:
    from gpuflex.localmesh import LocalMesh

    row: dict[str, Any] = {"nodes": nodes, "rounds_asked": rounds, "committed": 0, "all_contributed": False}
    with tempfile.TemporaryDirectory(prefix=f"realmesh-{nodes}-") as tmp, \
            LocalMesh(Path(tmp), nodes, log_level="warning") as mesh:
        t0 = time.time()
        mesh.start(timeout=300)
        row["started_s"] = time.time() - t0
        try:
            row["connected_s"] = mesh.wait_connected(timeout=300)
        except TimeoutError:
            row["connected_s"] = None
        row["min_up"] = min(mesh.up_counts())
        log(f"{nodes}: started in {row['started_s']:.0f}s, settled {row['connected_s']}s later, "
            f"min peers up {row['min_up']}")
        pids = [mesh.procs[i].pid for i in range(nodes)]
        cpu0 = [cpu_seconds(p) for p in pids]
        job = mesh.submit(job_spec(rounds, local_steps, nodes))
        t_job = time.time()
        fds = 0
        shown = 0
        while time.time() - t_job < timeout_s:
            state = mesh.job(0, job)
            fds = max(fds, max(open_fds(p) for p in pids))
            metrics = state.get("metrics", [])
            for m in metrics[shown:]:
                log(f"{nodes}: round {m['round']}/{rounds}: {m['contributors']} contributors, {m['duration_s']:.1f}s")
            shown = len(metrics)
            if state["state"] in ("done", "failed"):
                break
            time.sleep(2.0)
        wall = time.time() - t_job
        state = mesh.job(0, job)
        metrics = state.get("metrics", [])
        row.update({
            "state": state["state"], "committed": len(metrics), "job_s": wall,
            "contributors": [m["contributors"] for m in metrics],
            "round_s": [round(m["duration_s"], 1) for m in metrics],
            "fds_max": fds, "pss_total_mb": sum(pss_mb(p) for p in pids),
            "cpu_per_node_s": sum(cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)) / nodes,
        })
        row["all_contributed"] = row["committed"] == rounds and all(c == nodes for c in row["contributors"])
        log(f"{nodes}: {row}")
    return row


def render(result: dict[str, Any]) -> str:
    rows = [{**r, "contributors_s": ",".join(map(str, r.get("contributors", []))),
             "round_s_s": ", ".join(map(str, r.get("round_s", [])))} for r in result["rows"]]
    cols = [("nodes", "nodes", "d"), ("connected_s", "settled s", ".0f"), ("min_up", "min peers up", "d"),
            ("committed", "rounds", "d"), ("contributors_s", "contributors", ""), ("round_s_s", "round s", ""),
            ("job_s", "job s", ".0f"), ("fds_max", "fds max", "d"), ("pss_total_mb", "PSS total MB", ".0f"),
            ("cpu_per_node_s", "CPU s/node", ".1f")]
    ok = [r["nodes"] for r in result["rows"] if r["all_contributed"]]
    lines = [f"Demo job, {result['rounds']} rounds of {result['local_steps']} local steps, real node processes "
             "on 127.0.0.1", format_table(rows, cols),
             f"largest mesh that committed every round with every node contributing: {max(ok) if ok else 'none'}"]
    return "\n".join(lines)


def main() -> None:
    stop_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--local-steps", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=600.0, help="for the job, at each size")
    add_json_flag(ap)
    args = ap.parse_args()
    rows = [measure(n, args.rounds, args.local_steps, args.timeout_s) for n in args.nodes]
    emit({"rows": rows, "rounds": args.rounds, "local_steps": args.local_steps}, args.json, render)


if __name__ == "__main__":
    main()
