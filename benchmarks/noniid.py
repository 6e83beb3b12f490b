"""Federated against central training under label skew: final and best accuracy per strategy.

An **in-process simulation** (``gpuflex.simulate``, no node processes): every member's update
goes through the node's own encoder, reducer and server optimizer, so what converges here
converges the same way on a mesh. For each task, Dirichlet α (or the natural groups of
Shakespeare's speaking roles), node count and strategy it runs the job over several seeds and
prints the mean final accuracy, the mean best round's accuracy and their spread, beside
central training on the union of the same data with the same compute (``rounds ×
local_epochs`` epochs, ``gpuflex.ml.baseline``) for the same seeds.

The strategies are job-file settings laid over the task's job; ``default`` is the job with
nothing changed, so the table shows what a user who changes nothing gets. ``--set KEY=VALUE``
lays further settings over every strategy (probes), and ``--partition iid`` splits the same data
without skew, which separates what skew costs from what splitting the steps across members
costs.

Where the job counts steps (Shakespeare), each member takes ``rounds × local_steps`` steps, so
the members' steps added up are ``nodes`` times the one-member budget of ``central``;
``--central-lrs`` adds central training with that total at each learning rate given (the best
is the tuned central run with the same total steps), and ``--central-only`` runs only those.

Run:

    python -m benchmarks.noniid [--task digits] [--alphas 1.0 0.5 0.1] [--nodes 4 10]
                                [--seeds 0 1 2] [--strategies default fedavgm-0.7 ...] [--quick] [--json]
    python -m benchmarks.noniid --bytes [--nodes 4]   # bytes per round of each drift correction
    python -m benchmarks.noniid --task shakespeare --shakespeare PATH --nodes 3 6 [--partition iid]
                                [--set rounds=20 local_steps=10] [--central-lrs 0.002 0.005 [--central-only]]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_json_flag, emit, format_table, log, stop_on_sigterm

#: The tasks: the job over which the strategies are laid.
TASKS: dict[str, dict[str, Any]] = {
    "digits": {"name": "noniid-digits", "model": "digits-cnn", "data": "sklearn-digits",
               "partition": "dirichlet", "rounds": 15},
    # Shakespeare by speaking role: each node holds whole roles (natural skew); the text file
    # comes from the operator's [data] (``--shakespeare PATH``).
    "shakespeare": {"name": "noniid-shakespeare", "model": "char-gru", "data": "shakespeare",
                    "partition": "groups", "rounds": 10, "local_steps": 20, "local_epochs": 0,
                    "batch_size": 32, "lr": 0.002, "optimizer": "adam"},
}
#: Settings each strategy lays over the task's job ("default": none).
STRATEGIES: dict[str, dict[str, Any]] = {
    "default": {},
    "fedavg": {"strategy": "fedavg", "server_lr": 1.0, "drift_correction": "none"},
    "fedavgm-0.7": {"strategy": "fedavgm", "server_lr": 0.7, "server_momentum": 0.7},
    "fedavgm-1.0": {"strategy": "fedavgm", "server_lr": 1.0, "server_momentum": 0.7},
    "fedavgm-1.0-0.8": {"strategy": "fedavgm", "server_lr": 1.0, "server_momentum": 0.8},
    "fedavgm-1.5": {"strategy": "fedavgm", "server_lr": 1.5, "server_momentum": 0.7},
    "fedavgm-0.3-0.9": {"strategy": "fedavgm", "server_lr": 0.3, "server_momentum": 0.9},
    "fedprox": {"strategy": "fedavg", "server_lr": 1.0, "drift_correction": "fedprox", "prox_mu": 0.1},
    "fedavgm+fedprox": {"strategy": "fedavgm", "server_lr": 1.0, "server_momentum": 0.7,
                        "drift_correction": "fedprox", "prox_mu": 0.01},
    "scaffold": {"strategy": "fedavg", "server_lr": 1.0, "drift_correction": "scaffold"},
    "feddyn": {"strategy": "fedavg", "server_lr": 1.0, "drift_correction": "feddyn", "prox_mu": 0.01},
    "feddyn-0.1": {"strategy": "fedavg", "server_lr": 1.0, "drift_correction": "feddyn", "prox_mu": 0.1},
}
#: What ``--bytes`` compares: FedAvg and each drift correction, one round each.
BYTES_STRATEGIES = ("fedavg", "fedprox", "scaffold", "feddyn")


def bytes_per_round(task: str, nodes: int, data: dict[str, str]) -> list[dict[str, Any]]:
    """Bytes each member uploads in one round under FedAvg and each drift correction, measured
    on the encoded updates of a real round (``simulate``), and their ratio to FedAvg's."""
    from gpuflex.jobspec import JobSpec
    from gpuflex.nodeconfig import NodeConfig
    from gpuflex.simulate import simulate

    config = NodeConfig(data={k: Path(v) for k, v in data.items()}) if data else NodeConfig()
    rows: list[dict[str, Any]] = []
    for strategy in BYTES_STRATEGIES:
        job = {**TASKS[task], **STRATEGIES[strategy], "local_epochs": 0, "local_steps": 1}
        history = simulate(JobSpec.from_dict(job), nodes, rounds=1, config=config)
        rows.append({"strategy": strategy, "upload_bytes": history[0]["upload_bytes"] / nodes,
                     "download_bytes": history[0]["download_bytes"] / nodes})
    for row in rows:
        row["ratio"] = row["upload_bytes"] / rows[0]["upload_bytes"]
    return rows


_CENTRAL: dict[tuple[str, int], dict[str, Any]] = {}
#: Central runs on the union at a given learning rate, scored at several step counts:
#: (task, seed, lr) -> {steps: accuracy}.
_CENTRAL_STEPS: dict[tuple[str, int, float], dict[int, float]] = {}


def central_at_steps(spec: Any, steps: list[int], config: Any) -> dict[int, float]:
    """Central training on the union with the job's optimizer and learning rate, one
    sequential run to the largest of ``steps``, scored on the test split at each of them. The
    learning rate is constant, so the score at ``k`` steps is that of a ``k``-step run."""
    import dataclasses

    import torch

    from gpuflex.ml.baseline import seeded_train
    from gpuflex.ml.models import build_model
    from gpuflex.ml.train import evaluate, pick_device
    from gpuflex.ml.workload import load_bundle, resolve_data_path

    bundle = load_bundle(spec, resolve_data_path(spec, config))
    device = pick_device()
    model = build_model(spec, bundle)
    scores: dict[int, float] = {}
    done = 0

    def checkpoint() -> None:  # called before each optimizer step, with ``done`` steps taken
        nonlocal done
        if done in steps:
            with torch.random.fork_rng(devices=[]):  # scoring must not move the shuffles that follow
                scores[done] = evaluate(model, bundle.test, device)["accuracy"]
            model.train()
        done += 1

    budget = dataclasses.replace(spec, local_epochs=0, local_steps=max(steps))
    # Trained as ``central_baseline`` trains, so a checkpoint scores what that run scores.
    seeded_train(spec, model, bundle.train, budget, device, before_step=checkpoint)
    scores[max(steps)] = evaluate(model, bundle.test, device)["accuracy"]
    return scores


def job_of(task: str, alpha: float, strategy: str, seed: int, overrides: dict[str, Any]) -> Any:
    from gpuflex.jobspec import JobSpec

    job = {**TASKS[task], **STRATEGIES[strategy], "seed": seed, **overrides}
    if job["partition"] == "dirichlet":
        job["alpha"] = alpha
    return JobSpec.from_dict(job)


def run_one(task: str, alpha: float, nodes: int, strategy: str, seed: int, data: dict[str, str],
            overrides: dict[str, Any] | None = None, central_lrs: list[float] | None = None,
            all_nodes: list[int] | None = None) -> dict[str, Any]:
    """One federated run and its central baseline, on one seed.

    ``overrides`` are job settings laid over the task and strategy. With ``central_lrs`` (tasks
    that count steps), central training on the union also runs with the members' steps added up
    (``nodes × rounds × local_steps``) at each of those learning rates, and ``central_total``
    is the best of them: the tuned central run with the same total steps.
    """
    import dataclasses

    import torch

    from gpuflex.ml.baseline import central_baseline
    from gpuflex.nodeconfig import NodeConfig
    from gpuflex.simulate import simulate

    torch.manual_seed(seed)
    spec = job_of(task, alpha, strategy, seed, overrides or {})
    config = NodeConfig(data={k: Path(v) for k, v in data.items()}) if data else NodeConfig()
    start = time.perf_counter()
    history = simulate(spec, nodes, config=config)
    accs = [r["accuracy"] for r in history]
    totals: dict[float, float] = {}
    if central_lrs and spec.uses_steps:
        # central training sees the union: the split, strategy and server settings do not matter
        member = spec.rounds * spec.local_steps
        steps = sorted({member} | {n * member for n in (all_nodes or [nodes])})
        for lr in central_lrs:
            if (task, seed, lr) not in _CENTRAL_STEPS:
                torch.manual_seed(seed)
                _CENTRAL_STEPS[(task, seed, lr)] = central_at_steps(dataclasses.replace(spec, lr=lr), steps, config)
            totals[lr] = _CENTRAL_STEPS[(task, seed, lr)][nodes * member]
        if spec.lr in central_lrs:  # the one-member budget at the job's own learning rate
            _CENTRAL.setdefault((task, seed), {"accuracy": _CENTRAL_STEPS[(task, seed, spec.lr)][member]})
    key = (task, seed)  # central training sees the union: the split and strategy do not matter
    if key not in _CENTRAL:
        _CENTRAL[key] = central_baseline(spec, config=config)
    central = _CENTRAL[key]
    up = sum(r["upload_bytes"] for r in history) / (nodes * len(history))
    # model.pt is the round the job's final_model selects: with "best" that round was chosen on
    # the same held-out split it is scored on here, so its figure flatters; "final" does not.
    user = max(accs) if spec.final_model == "best" else accs[-1]
    best_lr = max(totals, key=lambda lr: totals[lr]) if totals else None
    return {"final": accs[-1], "best": max(accs), "user": user, "central": central["accuracy"],
            "central_total": totals[best_lr] if best_lr is not None else None, "central_total_lr": best_lr,
            "central_by_lr": totals, "history": accs,
            "upload_per_member": up, "seconds": time.perf_counter() - start}


def summarise(task: str, alpha: float, nodes: int, strategy: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in runs)

    def spread(key: str) -> float:
        return statistics.pstdev(r[key] for r in runs) if len(runs) > 1 else 0.0

    row = {"task": task, "alpha": alpha if TASKS[task]["partition"] == "dirichlet" else None, "nodes": nodes,
           "strategy": strategy, "seeds": len(runs), "final": mean("final"), "final_sd": spread("final"),
           "best": mean("best"), "best_sd": spread("best"), "user": mean("user"), "central": mean("central"),
           "gap_final": mean("final") - mean("central"), "gap_best": mean("best") - mean("central"),
           "upload_kb": mean("upload_per_member") / 1024, "runs": runs}
    if all(r.get("central_total") is not None for r in runs):
        row.update(central_total=mean("central_total"), central_total_sd=spread("central_total"),
                   gap_total=mean("final") - mean("central_total"))
    return row


def central_table(task: str, node_counts: list[int], seeds: list[int], lrs: list[float], data: dict[str, str],
                  overrides: dict[str, Any], as_json: bool) -> None:
    """Central training on the union at each learning rate, scored at one member's steps and at
    the members' steps added up for each node count: mean and spread over the seeds."""
    import dataclasses

    import torch

    from gpuflex.nodeconfig import NodeConfig

    config = NodeConfig(data={k: Path(v) for k, v in data.items()}) if data else NodeConfig()
    rows: list[dict[str, Any]] = []
    for lr in lrs:
        per_seed: list[dict[int, float]] = []
        for seed in seeds:
            spec = job_of(task, 0.0, "default", seed, overrides)
            member = spec.rounds * spec.local_steps
            steps = sorted({member} | {n * member for n in node_counts})
            torch.manual_seed(seed)
            per_seed.append(central_at_steps(dataclasses.replace(spec, lr=lr), steps, config))
            log(f"central lr={lr} seed {seed}: {per_seed[-1]}")
        for k in sorted(per_seed[0]):
            accs = [p[k] for p in per_seed]
            rows.append({"lr": lr, "steps": k, "accuracy": statistics.fmean(accs),
                         "sd": statistics.pstdev(accs) if len(accs) > 1 else 0.0, "per_seed": accs})
    emit({"task": task, "seeds": seeds, "central_only": True, "rows": rows}, as_json,
         lambda r: format_table(r["rows"], [("lr", "lr", "g"), ("steps", "steps", "d"),
                                            ("accuracy", "central", ".3f"), ("sd", "± sd", ".3f")]))


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` job settings; a value is read as JSON where it parses, else as a string."""
    import json

    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set wants KEY=VALUE, got {pair!r}")
        try:
            settings[key] = json.loads(value)
        except ValueError:
            settings[key] = value
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="digits")
    parser.add_argument("--alphas", type=float, nargs="+", default=[1.0, 0.5, 0.1])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 10])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--strategies", nargs="+", choices=sorted(STRATEGIES),
                        default=["default", "fedavg", "fedavgm-0.7", "fedavgm-1.0", "fedprox", "scaffold"])
    parser.add_argument("--shakespeare", default="", help="path of the Shakespeare text (task shakespeare)")
    parser.add_argument("--partition", default="",
                        help="split the task's data this way instead (iid: the same data without skew)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="job settings laid over the task and strategy (probes)")
    parser.add_argument("--central-lrs", type=float, nargs="+", default=[],
                        help="tasks counting steps: also train central with the members' steps added up, at each "
                             "of these learning rates; the best is the tuned central run")
    parser.add_argument("--central-only", action="store_true",
                        help="with --central-lrs: only the central runs, scored at one member's steps and at "
                             "each node count's total")
    parser.add_argument("--quick", action="store_true", help="α = 0.1, 4 nodes, one seed, two strategies")
    parser.add_argument("--bytes", action="store_true",
                        help="only the bytes per member per round of FedAvg and each drift correction")
    add_json_flag(parser)
    args = parser.parse_args()
    stop_on_sigterm()
    from gpuflex.jobspec import JobSpec

    data = {"shakespeare": args.shakespeare} if args.shakespeare else {}
    if args.bytes:
        rows = bytes_per_round(args.task, args.nodes[0], data)
        emit({"task": args.task, "nodes": args.nodes[0], "rows": rows}, args.json,
             lambda r: format_table(r["rows"], [("strategy", "strategy", ""), ("upload_bytes", "B up / member", ".0f"),
                                                ("ratio", "× FedAvg", ".2f"),
                                                ("download_bytes", "B down / member", ".0f")]))
        return
    if args.quick:
        args.alphas, args.nodes, args.seeds, args.strategies = [0.1], [4], [0], ["default", "fedavg"]
    overrides = parse_settings(args.set)
    if args.partition:
        overrides["partition"] = args.partition
    if args.central_only:
        if not args.central_lrs or not JobSpec.from_dict(TASKS[args.task]).uses_steps:
            raise SystemExit("--central-only needs --central-lrs and a task that counts steps")
        central_table(args.task, args.nodes, args.seeds, args.central_lrs, data, overrides, args.json)
        return
    partition = overrides.get("partition", TASKS[args.task]["partition"])
    alphas = args.alphas if partition == "dirichlet" else [0.0]
    rows = []
    for alpha in alphas:
        for nodes in args.nodes:
            for strategy in args.strategies:
                runs = []
                for seed in args.seeds:
                    runs.append(run_one(args.task, alpha, nodes, strategy, seed, data, overrides,
                                        args.central_lrs, args.nodes))
                    x = runs[-1]
                    log(f"  seed {seed}: final {x['final']:.4f} best {x['best']:.4f} central {x['central']:.4f}"
                        + (f" central same total steps {x['central_by_lr']}" if x["central_by_lr"] else ""))
                rows.append(summarise(args.task, alpha, nodes, strategy, runs))
                r = rows[-1]
                log(f"{args.task} α={alpha} n={nodes} {strategy}: final {r['final']:.3f} best {r['best']:.3f} "
                    f"central {r['central']:.3f} ({sum(x['seconds'] for x in runs):.0f}s)")
    cols = [("task", "task", ""), ("alpha", "α", ".1f"), ("nodes", "nodes", "d"), ("strategy", "strategy", ""),
            ("final", "final", ".3f"), ("final_sd", "± sd", ".3f"), ("best", "best", ".3f"),
            ("best_sd", "± sd", ".3f"), ("user", "model.pt", ".3f"), ("central", "central", ".3f"),
            ("gap_final", "final − central", "+.3f"),
            ("gap_best", "best − central", "+.3f"), ("upload_kb", "KB up / member / round", ".0f")]
    if rows and all("central_total" in r for r in rows):
        cols += [("central_total", "central, same total steps", ".3f"), ("central_total_sd", "± sd", ".3f"),
                 ("gap_total", "final − same total", "+.3f")]
    emit({"task": args.task, "seeds": args.seeds, "simulated": True, "settings": overrides, "rows": rows}, args.json,
         lambda r: format_table(r["rows"], cols))


if __name__ == "__main__":
    main()
