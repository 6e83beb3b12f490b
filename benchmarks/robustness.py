"""Final digits accuracy for each (rule, attack) with 0-3 of 10 nodes hostile.

Two ways to run, same job, same attacks (gpuflex/adversary.py), same reducers
(gpuflex/node/core/pipeline.py ``make_reducer``):

* default: an **in-process simulation** of the round: 10 Workloads train from the same base,
  the chosen ones poison their delta (or, for label-flip, train on flipped labels), and the
  updates are reduced through the real pipeline reducers, in the job's tree or flat. Ten node
  processes on a 2-core machine would spend the run on start-up and scheduling; the table
  needs 100+ cells, so they are simulated. Signing and transport do not touch the numbers.
* ``--mesh``: the real thing for one cell: 10 ``gpuflex node start`` processes on loopback
  (LocalMesh), the chosen nodes started with ``--adversary KIND``; final accuracy from the
  ledger. Slow on 2 cores (minutes per cell): keep rounds and local steps small.

Run:

    python -m benchmarks.robustness --quick            # 0 and 2 attackers, main rules
    python -m benchmarks.robustness                     # 0-3 attackers, all rules
    python -m benchmarks.robustness --mesh --rule median --attack scale --attackers 2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Stopwatch, add_json_flag, emit, format_table, log, stop_on_sigterm

NODES = 10
ATTACKS = ("sign-flip", "scale", "gaussian", "little-is-enough", "label-flip")
RULES: dict[str, dict[str, Any]] = {
    "mean": {},
    "median": {},
    "trimmed-mean": {"beta": 0.3},
    "multi-krum": {"f": 3},
    "centered-clipping": {"tau": 0.5, "iterations": 3},
}
JOB: dict[str, Any] = {"name": "robustness", "model": "digits-cnn", "data": "sklearn-digits",
                       "partition": "iid", "rounds": 10, "local_epochs": 3, "batch_size": 32,
                       "lr": 0.05, "optimizer": "momentum", "min_nodes": 7, "group_size": 4}


def job_dict(rule: str, mode: str, rounds: int) -> dict[str, Any]:
    return {**JOB, "rule": rule, "rule_params": RULES[rule], "rounds": rounds,
            "aggregation_mode": mode if rule != "mean" else "tree"}


def simulate(rule: str, attack: str | None, attackers: int, mode: str, rounds: int) -> float:
    """Final test accuracy of the in-process simulation of one cell."""
    from aggregation.tree import build_tree, children
    from gpuflex.adversary import flip_labels, make_adversary
    from gpuflex.jobspec import JobSpec
    from gpuflex.ml.workload import Workload
    from gpuflex.node.core.pipeline import make_reducer

    spec = JobSpec.from_dict(job_dict(rule, mode, rounds))
    nodes = [Workload(spec, i, NODES) for i in range(NODES)]
    hostile = {i: make_adversary(attack) for i in range(NODES - attackers, NODES)} if attack else {}
    for i, adv in hostile.items():
        if adv.kind == "label-flip":  # the data hook the node applies (see the report's diff)
            nodes[i]._train = flip_labels(nodes[i]._train, nodes[i].bundle.num_classes)
    names = [f"n{i}" for i in range(NODES)]
    group = NODES if mode == "flat-robust" else spec.group_size
    parent = build_tree(names, group, names[0])
    params = nodes[0].initial_params()
    for _ in range(rounds):
        deltas = {}
        for i, node in enumerate(nodes):
            delta, _ = node.train(params)
            deltas[names[i]] = hostile[i].tamper(delta) if i in hostile else delta

        def reduce(name: str, deltas: dict[str, np.ndarray]) -> np.ndarray:
            red = make_reducer(spec, parent[name] is None)
            inputs = [(name, deltas[name])] + [
                (kid, reduce(kid, deltas) if children(parent, kid) else deltas[kid])
                for kid in children(parent, name)]
            for who, vec in inputs:
                if np.all(np.isfinite(vec)):  # a leader drops non-finite input, as the mesh does
                    red.add(vec, 1.0, who)
            return red.result() if red.count else np.zeros_like(deltas[name])

        params = (params + reduce(names[0], deltas)).astype(np.float32)
        if not np.all(np.isfinite(params)):
            return 0.1  # diverged: no better than chance on 10 classes
    return float(nodes[0].evaluate(params)["accuracy"])


def run_mesh(rule: str, attack: str | None, attackers: int, mode: str, rounds: int) -> float:
    """One cell on 10 real node processes; the last ``attackers`` nodes run ``--adversary``."""
    from gpuflex.localmesh import LocalMesh

    hostile = set(range(NODES - attackers, NODES)) if attack else set()
    with tempfile.TemporaryDirectory(prefix="gpuflex-bench-robust-") as tmp:
        mesh = LocalMesh(Path(tmp), NODES, log_level="warning",
                         node_args=lambda i: ["--adversary", attack] if i in hostile and attack else [])
        try:
            mesh.start(timeout=300.0)
            mesh.wait_connected(timeout=300.0)
            job = mesh.submit(job_dict(rule, mode, rounds))
            mesh.wait_job(job, [0], timeout=300.0 + rounds * 120.0)
            rows = mesh.call(0, "ledger", {"job": job}, timeout=30)
        finally:
            mesh.close()
    return float(rows[-1]["metrics"]["accuracy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="0 and 2 attackers only")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--mode", choices=("flat-robust", "tree"), default="flat-robust")
    parser.add_argument("--mesh", action="store_true", help="real node processes, one cell")
    parser.add_argument("--rule", default="median")
    parser.add_argument("--attack", default="scale")
    parser.add_argument("--attackers", type=int, default=2)
    add_json_flag(parser)
    args = parser.parse_args()
    stop_on_sigterm()
    rounds = args.rounds or 10
    if args.mesh:
        with Stopwatch() as sw:
            acc = run_mesh(args.rule, args.attack, args.attackers, args.mode, rounds)
        result = {"mesh": True, "rule": args.rule, "attack": args.attack, "attackers": args.attackers,
                  "accuracy": acc, "seconds": sw.seconds}
        emit(result, args.json, lambda r: f"{r['rule']} vs {r['attack']} x{r['attackers']}: "
             f"accuracy {r['accuracy']:.3f} ({r['seconds']:.0f}s, real processes)")
        return
    counts = (2,) if args.quick else (1, 2, 3)
    rows = []
    for rule in RULES:
        row: dict[str, Any] = {"rule": rule, "none": simulate(rule, None, 0, args.mode, rounds)}
        for attack in ATTACKS:
            for k in counts:
                row[f"{attack} x{k}"] = simulate(rule, attack, k, args.mode, rounds)
        log(f"row {row}")  # partial results survive an interrupted run
        rows.append(row)
    cols = [("rule", "rule", "")] + [(c, c, ".3f") for c in rows[0] if c != "rule"]
    emit({"mode": args.mode, "rounds": rounds, "nodes": NODES, "simulated": True, "rows": rows},
         args.json, lambda r: format_table(r["rows"], cols))


if __name__ == "__main__":
    main()
