"""Mesh overhead per round, and memory per node, for 4 to 32 real node processes on loopback.

A round costs local training plus everything the mesh adds: planning, fetching the base
model, signing, sending deltas up the group tree, reducing, evaluating and gossiping the
result. With a tiny model (the digits CNN, one local step) training is nearly free, so what
is left is the mesh's fixed cost per round, the figure that decides how small a round can
usefully be. For each mesh size the benchmark runs a real job on ``gpuflex node start``
processes (``LocalMesh``) and, per committed round, takes

* ``duration_s`` from the ledger (plan issued to result signed, on the coordinator);
* local compute, the slowest contributor's training seconds, read from the signed Updates
  embedded in node 0's ledger file (the ``ledger`` API only carries round summaries);
* overhead = duration - compute, and its ratio to compute, both from the same rounds;
* bytes sent per node per round, from the ``status`` counters before and after the job;
* resident memory per node process (current and peak, from /proc) once the job is done, which
  with the round times says how many nodes one machine can host.

The same run also times the committed-round checks before and after they required evidence
(``benchmarks.round_checks``: one result by gossip, a whole ledger by catch-up sync, on the same
signed rounds) and sets the added cost per round beside the mesh's overhead per round.

Run:

    python -m benchmarks.round_overhead [--nodes 4 8 16 32] [--rounds 4] [--json]
    python -m benchmarks.round_overhead --nodes 4 --checks 4 16 64   # both, side by side
    python -m benchmarks.round_overhead --nodes --checks 4 16 64     # the checks alone
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Stopwatch,
    add_json_flag,
    emit,
    format_table,
    log,
    ratio,
    stop_on_sigterm,
)

KB = 1000


def job_spec(nodes: int, rounds: int, batch_size: int, local_steps: int) -> dict[str, Any]:
    """The demo job cut to a little local training, waiting for every node before round 1.

    ``local_steps=0`` means one local epoch; ``--local-steps 1`` leaves the mesh's own cost
    almost alone in the round.
    """
    from gpuflex.jobspec import JobSpec, example_job_toml, tomllib

    data = tomllib.loads(example_job_toml())
    data.update(name=f"bench-overhead-{nodes}", rounds=rounds, local_epochs=1, local_steps=local_steps,
                batch_size=batch_size, min_nodes=nodes)
    return JobSpec.from_dict(data).to_dict()


def training_seconds(home: Path, job: str) -> dict[int, list[float]]:
    """Per round, each contributor's signed training seconds, from a node's ledger file."""
    from gpuflex.node.core.ledger import verify_chain
    from gpuflex.node.core.ledgerfile import read_ledger_file
    from gpuflex.node.core.messages import walk_contributions

    paths = sorted(home.glob(f"jobs/{job}*/ledger.msgpack"))
    if not paths:
        raise FileNotFoundError(f"no ledger for job {job} under {home}")
    per_round: dict[int, list[float]] = {}
    for res in verify_chain(read_ledger_file(paths[0]), None):
        updates = walk_contributions(res.updates, res.partials, res.job, res.round)
        per_round[res.round] = [float(u.metrics.get("seconds", 0.0)) for u in updates]
    return per_round


def run_mesh(nodes: int, rounds: int, batch_size: int, local_steps: int) -> dict[str, Any]:
    """Start ``nodes`` processes, run one job, read the ledger, stop every process."""
    from gpuflex.localmesh import LocalMesh

    with tempfile.TemporaryDirectory(prefix=f"gpuflex-bench-rounds{nodes}-") as tmp:
        mesh = LocalMesh(Path(tmp), nodes, log_level="warning")
        try:
            log(f"{nodes} nodes: starting processes")
            with Stopwatch() as start:
                mesh.start(timeout=60.0 + 10.0 * nodes)
            connect_s = mesh.wait_connected(timeout=60.0 + 5.0 * nodes)
            log(f"{nodes} nodes: up in {start.seconds:.0f}s, fully connected {connect_s:.0f}s later")
            before = [int(mesh.call(i, "status")["bytes_sent"]) for i in range(nodes)]
            job = mesh.submit(job_spec(nodes, rounds, batch_size, local_steps))
            with Stopwatch() as run:
                mesh.wait_job(job, list(range(nodes)), timeout=120.0 + rounds * (60.0 + 5.0 * nodes))
            after = [int(mesh.call(i, "status")["bytes_sent"]) for i in range(nodes)]
            rows = mesh.call(0, "ledger", {"job": job}, timeout=30)
            seconds = training_seconds(mesh.home(0), job)
            model_bytes = (mesh.home(0) / "blobs" / rows[-1]["model_hash"]).stat().st_size
            memory = [process_memory_mb(proc.pid) for proc in mesh.procs.values()]
        finally:
            mesh.close()
    per_round = []
    for row in rows:
        duration = float(row["metrics"]["duration_s"])
        compute = max(seconds.get(row["round"], [0.0]))
        per_round.append({"round": row["round"], "duration_s": duration, "compute_s": compute,
                          "overhead_s": duration - compute, "contributors": len(row["contributors"])})
    sent = [(b - a) / rounds for a, b in zip(before, after, strict=True)]
    overhead = [r["overhead_s"] for r in per_round]
    compute = [r["compute_s"] for r in per_round]
    return {
        "nodes": nodes, "rounds": rounds, "start_s": start.seconds, "connect_s": connect_s, "job_s": run.seconds,
        "duration_s": statistics.median(r["duration_s"] for r in per_round),
        "compute_s": statistics.median(compute), "overhead_s": statistics.median(overhead),
        "overhead_max_s": max(overhead), "overhead_vs_compute": ratio(statistics.median(overhead),
                                                                     statistics.median(compute)),
        "contributors_min": min(r["contributors"] for r in per_round),
        "sent_kb_per_node_round": statistics.mean(sent) / KB, "sent_kb_max_node_round": max(sent) / KB,
        "model_kb": model_bytes / KB, "sent_vs_model": ratio(statistics.mean(sent), model_bytes),
        "rss_mb_per_node": statistics.median(m[0] for m in memory),
        "peak_rss_mb_per_node": max(m[1] for m in memory),
        "rss_mb_total": sum(m[0] for m in memory),
        "per_round": per_round,
    }


def process_memory_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process in MB, from /proc/PID/status."""
    fields: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024 / 1e6
    except OSError:
        return float("nan"), float("nan")
    return fields.get("VmRSS", float("nan")), fields.get("VmHWM", float("nan"))


def run(sizes: list[int], rounds: int, batch_size: int, local_steps: int) -> dict[str, Any]:
    meshes = []
    for n in sizes:
        try:
            mesh = run_mesh(n, rounds, batch_size, local_steps)
        except (TimeoutError, RuntimeError, OSError) as exc:
            # One size failing (a round that never commits) must not discard the others.
            log(f"{n} nodes: FAILED: {exc}")
            mesh = {"nodes": n, "error": str(exc)}
        else:
            log(f"{n} nodes: round {mesh['duration_s']:.2f}s, compute {mesh['compute_s']:.3f}s, "
                f"overhead {mesh['overhead_s']:.2f}s, {mesh['sent_kb_per_node_round']:.0f} KB/node/round")
        meshes.append(mesh)
        time.sleep(1.0)  # let the last mesh's sockets and processes go before the next
    return {"benchmark": "round_overhead", "rounds": rounds, "batch_size": batch_size, "local_steps": local_steps,
            "meshes": meshes}


def checks_share(result: dict[str, Any]) -> list[str]:
    """Per mesh size: what the new checks add to one round, against that round's overhead."""
    by_members = {row["members"]: row for row in result.get("checks", [])}
    lines = []
    for mesh in result["meshes"]:
        row = by_members.get(mesh["nodes"])
        if row is None or "error" in mesh:
            continue
        added_ms = row["gossip_after_ms"] - row["gossip_before_ms"]
        lines.append(f"{mesh['nodes']} nodes: the evidence checks add {added_ms:.2f} ms to a round whose mesh "
                     f"overhead is {mesh['overhead_s'] * 1000:.0f} ms "
                     f"({ratio(added_ms, mesh['overhead_s'] * 1000) * 100:.1f} %)")
    return lines


def render(result: dict[str, Any]) -> str:
    from benchmarks.round_checks import render as render_checks

    checks = [render_checks(result["checks"]), *checks_share(result)] if result.get("checks") else []
    if not result["meshes"]:
        return "\n".join(checks)
    return "\n".join([render_meshes(result), *checks])


def render_meshes(result: dict[str, Any]) -> str:
    columns = [("nodes", "nodes", ""), ("contributors_min", "contributors", "d"),
               ("duration_s", "round s", ".2f"), ("compute_s", "compute s", ".3f"),
               ("overhead_s", "overhead s", ".2f"), ("overhead_max_s", "overhead max s", ".2f"),
               ("overhead_vs_compute", "overhead / compute", ".1f"),
               ("sent_kb_per_node_round", "KB sent/node/round", ".0f"),
               ("sent_kb_max_node_round", "max node KB/round", ".0f"), ("sent_vs_model", "x model size", ".1f"),
               ("rss_mb_per_node", "RSS MB/node", ".0f"), ("peak_rss_mb_per_node", "peak RSS MB", ".0f"),
               ("rss_mb_total", "RSS MB all nodes", ".0f")]
    done = [m for m in result["meshes"] if "error" not in m]
    failed = [m for m in result["meshes"] if "error" in m]
    model_kb = done[0]["model_kb"] if done else float("nan")
    steps = result["local_steps"]
    training = f"local_steps = {steps}" if steps else "one local epoch"
    return "\n".join([
        f"Round overhead: digits CNN ({model_kb:.0f} KB), "
        f"{training}, batch "
        f"{result['batch_size']}, {result['rounds']} rounds; one `gpuflex node start` process per node on "
        "127.0.0.1; medians over rounds (overhead = round duration - slowest contributor's training)",
        format_table(done, columns),
        "  ".join(f"{m['nodes']} nodes: start {m['start_s']:.0f}s, connect {m['connect_s']:.0f}s, "
                  f"job {m['job_s']:.0f}s." for m in done),
        *(f"{m['nodes']} nodes: FAILED: {m['error']}" for m in failed),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[4, 8, 16, 32], help="mesh sizes to measure")
    parser.add_argument("--checks", type=int, nargs="*", default=[], metavar="CONTRIBUTORS",
                        help="also time the committed-round checks before and after, for these contributor counts")
    parser.add_argument("--checks-rounds", type=int, default=10, help="ledger length for the catch-up sync timing")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--local-steps", type=int, default=0, help="0 = one local epoch (see job_spec)")
    add_json_flag(parser)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    if min(args.nodes, default=2) < 2 or args.rounds < 1 or args.batch_size < 1 or args.local_steps < 0:
        parser.error("--nodes must be ≥ 2, --rounds and --batch-size ≥ 1")
    if not args.nodes and not args.checks:
        parser.error("nothing to measure: give --nodes, --checks or both")
    if min(args.checks, default=1) < 1 or args.checks_rounds < 1:
        parser.error("--checks counts and --checks-rounds must be ≥ 1")
    result = run(args.nodes, args.rounds, args.batch_size, args.local_steps)
    if args.checks:
        from benchmarks import round_checks

        log(f"timing the committed-round checks for {args.checks} contributors")
        result["checks"] = round_checks.run(args.checks, args.checks_rounds)
    emit(result, args.json, render)
    if any("error" in m for m in result["meshes"]):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
