"""Bytes on the wire to reach the same test loss: synchronous data-parallel, FedAvg and DiLoCo.

One model, one seed, one data split, N in-process workers (gpuflex/simulate.py), with every
update going through the node's own encoder, decoder, reducer and server optimizer. Each
strategy gets the same compute, counted in optimizer steps per worker: FedAvg runs the job's
rounds with its usual local work, and the others spend the same number of steps.

* ``sync``: synchronous data-parallel, the reference DiLoCo compares against: one step per
  round (local_steps = 1), averaged, and the job's optimizer applied by the server. For the
  digits job that is exactly momentum SGD on the mean gradient of N × batch_size samples.
* ``fedavg``: the job as users run it (several local epochs, fp32 deltas, FedAvg).
* ``diloco``: AdamW for H local steps, Nesterov outer step (lr 0.7, momentum 0.9, the paper's).
* ``diloco-int8``: the same with blockwise int8 pseudo-gradients and error feedback (the
  node's default for a lossy codec); the root's averaged step also travels in int8 and every
  member replays the outer step itself.
* ``diloco-int8-no-ef``: int8 without error feedback.
* ``fragments-int8``: ``diloco-int8`` with ``fragments = F`` (``--fragments``, 4), Streaming
  DiLoCo's schedule (arXiv 2501.18512): rounds of H / F local steps, each syncing one fragment
  in turn, so every fragment still syncs every H steps and each round moves 1/F of the bytes.
  Members train on from their own model between a fragment's syncs, as nodes do.
* ``fragments-int8-long``: the same fragments with rounds of H steps: each round moves 1/F of
  ``diloco-int8``'s bytes, and a fragment syncs every F x H steps.
* ``diloco-int8-short``: ``diloco-int8`` (the whole model every round) with ``fragments-int8``'s
  rounds of H / F steps: what the shorter rounds alone do, apart from the fragments.
* ``sparse``: ``codec = "sparse"`` with top-k 1/64 per chunk of 4096, 2-bit values, all of
  the residual kept (decay 1.0), the step back at 8 bits, and the outer step plain SGD at lr
  1 (SparseLoCo's: the error-feedback residual takes the place of outer momentum).
* ``sparseloco``: SparseLoCo's published settings (arXiv 2508.15706): the same top-k and
  2 bits, error feedback decayed by 0.95 each round.
* ``demo``: DeMo's (arXiv 2411.19870) transform: a DCT per chunk of 64, top-k of the
  coefficients (1 of 64 kept, DeMo's 32 of 64x64 where rows are chunked too), full-precision
  values.

Bytes are counted as the mesh moves them: each worker uploads its encoded update (the codec's
real output) and downloads what it needs to hold the committed model: the encoded step where
the codec allows it (fp16, int8), else the model blob, whose server-optimizer state
(momentum) travels with it because the root changes every round. The tree's partials between
leaders and the root are left out (the same for every strategy at N ≤ group_size: none).

Run:

    python -m benchmarks.diloco_bytes --quick            # about a minute
    python -m benchmarks.diloco_bytes                    # digits CNN, the demo's split
    python -m benchmarks.diloco_bytes --task shakespeare # char-GRU, reduced (CPU)
    python -m benchmarks.diloco_bytes --task shakespeare-full --workers 3  # the README job, 1,000 steps
    python -m benchmarks.diloco_bytes --task small-lm    # the `small` LM on the play, reduced
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import MB, add_json_flag, emit, format_table, log, ratio, stop_on_sigterm

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
REFERENCES = ("sync", "fedavg")
ORDER = ("sync", "fedavg", "diloco", "diloco-int8", "diloco-int8-no-ef", "diloco-int8-short", "fragments-int8",
         "fragments-int8-long", "sparse", "sparseloco", "demo")


#: One step per round, then the job's own optimizer applied by the server to the mean delta
#: (-lr * mean gradient): momentum SGD exactly, via server momentum with lr 1.
SYNC_MOMENTUM = {"strategy": "fedavgm", "server_lr": 1.0, "server_momentum": 0.9, "optimizer": "sgd",
                 "local_steps": 1, "local_epochs": 0}


@dataclass(frozen=True)
class Task:
    """A job and the DiLoCo settings for it; ``fedavg_rounds`` sets the compute budget."""

    job: dict[str, Any]
    fedavg_rounds: int
    local_steps: int  # DiLoCo's H
    inner_lr: float
    sync: dict[str, Any]  # job overrides for synchronous data-parallel
    sync_eval_every: int  # evaluate sync every this many steps (evaluation would dominate)
    reduced: bool


def tasks() -> dict[str, Callable[[], Task]]:
    def digits() -> Task:
        from gpuflex.demo import demo_spec

        job = demo_spec(15)
        return Task(job, job["rounds"], 50, 3e-3, {**SYNC_MOMENTUM, "lr": job["lr"]}, 1, False)

    def shakespeare() -> Task:
        # The README's Shakespeare job (Adam lr 0.005), cut down for a CPU. Its synchronous
        # twin: the gradient (inner SGD, lr 1) averaged, then FedAdam at the job's lr, which is
        # Adam without bias correction and with eps = FedAdam's tau (1e-3).
        job = {"name": "diloco-bytes", "model": "char-gru", "data": "shakespeare",
               "partition": "groups", "local_steps": 25,
               "batch_size": 32, "optimizer": "adam", "lr": 0.005}
        sync = {"strategy": "fedadam", "server_lr": job["lr"], "optimizer": "sgd", "lr": 1.0,
                "local_steps": 1, "local_epochs": 0}
        return Task(job, 8, 50, 5e-3, sync, 10, True)

    def shakespeare_full() -> Task:
        # The README's Shakespeare job at its full length: 20 rounds x 50 local steps, 1,000
        # optimizer steps per worker (run it with --workers 3 for the README's three nodes).
        reduced = shakespeare()
        return dataclasses.replace(reduced, job={**reduced.job, "local_steps": 50}, fedavg_rounds=20, reduced=False)

    def small_lm() -> Task:
        # The `small` llama-like LM (10M parameters, byte tokenizer) trained from scratch on the
        # play split by speaking role; AdamW as the node's LM jobs use it.
        job = {"name": "diloco-bytes-lm", "model": "llama", "data": "shakespeare", "partition": "groups",
               "local_steps": 25, "local_epochs": 0, "batch_size": 8, "optimizer": "adamw", "lr": 1e-3,
               "llm": {"size": "small", "seq_len": 128, "eval_sequences": 64}}
        sync = {"strategy": "fedadam", "server_lr": job["lr"], "optimizer": "sgd", "lr": 1.0,
                "local_steps": 1, "local_epochs": 0}
        return Task(job, 4, 50, 1e-3, sync, 10, True)

    return {"digits": digits, "shakespeare": shakespeare, "shakespeare-full": shakespeare_full, "small-lm": small_lm}


def variant_jobs(task: Task, args: argparse.Namespace) -> dict[str, tuple[dict[str, Any], bool]]:
    """Job overrides and error feedback on/off, per strategy."""
    diloco = {"strategy": "diloco", "optimizer": "adamw", "lr": args.inner_lr or task.inner_lr,
              "weight_decay": args.weight_decay, "local_steps": args.local_steps or task.local_steps,
              "local_epochs": 0, "server_lr": args.outer_lr, "server_momentum": args.outer_momentum}
    short = max(1, diloco["local_steps"] // args.fragments)  # fragments-int8's rounds: H / F steps
    sparse = {**diloco, "local_steps": args.sparse_local_steps or diloco["local_steps"], "codec": "sparse",
              "server_lr": args.sparse_outer_lr, "server_momentum": 0.0,
              "sparse_density": args.density, "sparse_bits": args.bits, "sparse_step_bits": args.step_bits}
    return {
        "sync": (task.sync, False),
        "fedavg": ({}, False),
        "diloco": (diloco, False),
        "diloco-int8": ({**diloco, "codec": "int8"}, True),
        "diloco-int8-no-ef": ({**diloco, "codec": "int8"}, False),
        "diloco-int8-short": ({**diloco, "codec": "int8", "local_steps": short}, True),
        "fragments-int8": ({**diloco, "codec": "int8", "fragments": args.fragments, "local_steps": short}, True),
        "fragments-int8-long": ({**diloco, "codec": "int8", "fragments": args.fragments}, True),
        "sparse": ({**sparse, "sparse_feedback_decay": 1.0}, True),
        "sparseloco": ({**sparse, "sparse_density": 64 / 4096, "sparse_bits": 2, "sparse_feedback_decay": 0.95},
                       True),
        "demo": ({**sparse, "sparse_density": 1 / 64, "sparse_chunk": 64, "sparse_transform": "dct",
                  "sparse_bits": 8, "sparse_step_bits": 8}, True),
    }


def first_reach(history: list[dict[str, Any]], key: str, target: float, higher: bool) -> dict[str, Any] | None:
    """Round, steps and bytes (cumulative) at the first evaluation that meets ``target``."""
    moved = steps = 0.0
    for h in history:
        moved += h["upload_bytes"] + h["download_bytes"]
        steps += h["steps"]
        value = h[key]
        if not math.isnan(value) and (value >= target if higher else value <= target):
            return {"round": h["round"], "steps": steps, "bytes": moved}
    return None


def summarise(name: str, history: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    losses = [h["loss"] for h in history if not math.isnan(h["loss"])]
    up = sum(h["upload_bytes"] for h in history)
    down = sum(h["download_bytes"] for h in history)
    return {"strategy": name, "rounds": len(history), "steps": sum(h["steps"] for h in history),
            "final_loss": history[-1]["loss"], "best_loss": min(losses), "final_accuracy": history[-1]["accuracy"],
            "upload_bytes": up, "total_bytes": up + down, "upload_mb": up / MB, "total_mb": (up + down) / MB,
            "round_mb": (history[-1]["upload_bytes"] + history[-1]["download_bytes"]) / MB,
            "peak_mb": max(h["upload_bytes"] + h["download_bytes"] for h in history) / MB, "seconds": seconds}


def reach_table(rows: list[dict[str, Any]], histories: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Bytes to FedAvg's final loss, to a loss every strategy reaches, and to FedAvg's final
    accuracy, with savings against the two references (reference bytes ÷ these)."""
    fedavg = next(r for r in rows if r["strategy"] == "fedavg")
    targets = [(f"loss <= {fedavg['final_loss']:.4f} (FedAvg's final)", "loss", fedavg["final_loss"], False),
               (f"loss <= {max(r['best_loss'] for r in rows):.4f} (worst best loss)", "loss",
                max(r["best_loss"] for r in rows), False),
               (f"accuracy >= {fedavg['final_accuracy']:.4f} (FedAvg's final)", "accuracy",
                fedavg["final_accuracy"], True)]
    out: list[dict[str, Any]] = []
    for label, key, target, higher in targets:
        hits = {r["strategy"]: first_reach(histories[r["strategy"]], key, target, higher) for r in rows}
        mb = {k: hit["bytes"] / MB if hit else math.nan for k, hit in hits.items()}
        mb.update({ref: math.nan for ref in REFERENCES if ref not in mb})  # a reference not run
        for name, hit in hits.items():
            out.append({"target": label, "strategy": name, "rounds": hit["round"] if hit else None,
                        "steps": hit["steps"] if hit else math.nan, "mb": mb[name],
                        **{f"x_{ref}": ratio(mb[ref], mb[name]) for ref in REFERENCES}})
    for row in rows:
        for ref in REFERENCES:
            base = next((r for r in rows if r["strategy"] == ref), {"total_bytes": math.nan, "upload_bytes": math.nan})
            row[f"total_x_{ref}"] = ratio(base["total_bytes"], row["total_bytes"])
            row[f"upload_x_{ref}"] = ratio(base["upload_bytes"], row["upload_bytes"])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from aggregation.errors import AggregationError
    from gpuflex.jobspec import JobSpec
    from gpuflex.ml.workload import pin_job_spec
    from gpuflex.nodeconfig import NodeConfig, with_flags
    from gpuflex.simulate import simulate
    from mesh.codec import WireError

    config = with_flags(NodeConfig(), data=[f"shakespeare={args.data}"])  # where the workers read the play

    task = tasks()[args.task]()
    if args.quick:
        task = dataclasses.replace(task, fedavg_rounds=4, local_steps=25, reduced=True)
    base = {**task.job, "seed": args.seed}
    jobs = variant_jobs(task, args)
    h = args.local_steps or task.local_steps
    histories: dict[str, list[dict[str, Any]]] = {}
    rows: list[dict[str, Any]] = []
    budget = 0.0
    names = [n for n in ORDER if n in args.variants]
    for name in ["fedavg", *(n for n in names if n != "fedavg")]:
        overrides, feedback = jobs[name]
        spec = pin_job_spec(JobSpec.from_dict({**base, **overrides}), None, config)  # an LM's hashes
        if name == "fedavg":
            rounds, every = args.rounds or task.fedavg_rounds, 1
        elif name == "sync":
            rounds, every = round(budget), task.sync_eval_every
        elif name in ("fragments-int8", "diloco-int8-short"):  # F rounds for each of DiLoCo's
            rounds, every = args.fragments * math.ceil(budget / h), 1
        else:
            rounds, every = math.ceil(budget / overrides.get("local_steps", h)), 1
        log(f"{name}: {rounds} rounds on {args.workers} workers")
        start = time.perf_counter()
        try:
            history = simulate(spec, args.workers, rounds, error_feedback=feedback, eval_every=every,
                               config=config)
        except (AggregationError, WireError) as exc:  # a diverged run sends non-finite updates
            raise SystemExit(f"error: {name} failed in training ({exc}); try a smaller learning rate") from None
        except KeyboardInterrupt:  # a time limit: the strategies that finished still make a table
            if name == "fedavg":
                raise
            log(f"{name}: stopped before its last round; reporting the strategies that finished")
            break
        histories[name] = history
        rows.append(summarise(name, history, time.perf_counter() - start))
        log(f"{name}: final loss {history[-1]['loss']:.4f}, accuracy {history[-1]['accuracy']:.4f}, "
            f"{rows[-1]['total_mb']:.1f} MB in {rows[-1]['seconds']:.0f}s")
        if name == "fedavg":  # the compute budget: FedAvg's steps per worker
            budget = sum(r["steps"] for r in history)
    rows.sort(key=lambda r: ORDER.index(r["strategy"]))
    reach = reach_table(rows, histories)
    return {"task": args.task, "reduced": task.reduced, "workers": args.workers, "seed": args.seed,
            "model": base["model"], "data": base["data"], "partition": base["partition"],
            "local_steps": h, "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum,
            "inner_lr": jobs["diloco"][0]["lr"], "weight_decay": args.weight_decay,
            "sync_eval_every": task.sync_eval_every, "steps_budget": budget,
            "sparse_local_steps": args.sparse_local_steps or h, "sparse_outer_lr": args.sparse_outer_lr,
            "fragments": args.fragments, "density": args.density, "bits": args.bits, "step_bits": args.step_bits,
            "rows": rows, "reach": reach,
            "curves": {k: [{key: v[key] for key in ("round", "loss", "accuracy", "upload_bytes", "download_bytes")}
                           for v in hist] for k, hist in histories.items()}}


def render(r: dict[str, Any]) -> str:
    every = r["sync_eval_every"]
    head = (f"DiLoCo bytes: {r['model']} on {r['data']} ({r['partition']} split), {r['workers']} workers, "
            f"seed {r['seed']}, {r['steps_budget']:.0f} optimizer steps per worker for every strategy"
            f"{' (REDUCED run)' if r['reduced'] else ''}\n"
            f"DiLoCo: AdamW lr {r['inner_lr']:g} (weight decay {r['weight_decay']:g}) for H = {r['local_steps']} "
            f"steps, outer Nesterov lr {r['outer_lr']:g} momentum {r['outer_momentum']:g}. "
            f"MB = 10^6 bytes, uploads plus downloads (model or int8 step) of all workers.\n"
            f"sparse, sparseloco, demo: H = {r['sparse_local_steps']}, outer SGD lr {r['sparse_outer_lr']:g}, "
            f"density {r['density']:g}, {r['bits']} bits up, {r['step_bits']} bits down (demo: its own).\n"
            f"fragments-int8 and diloco-int8-short: H / {r['fragments']} steps a round, fragments-int8 with "
            f"fragments = {r['fragments']}; "
            f"fragments-int8-long: fragments = {r['fragments']}, H steps a round.\n"
            f"\"x sync\" / \"x fedavg\": that reference's bytes divided by this strategy's (higher = fewer bytes)."
            + (f"\nsync is evaluated every {every} steps, so its bytes to a target may be overstated by up to "
               f"{every - 1} steps' worth." if every > 1 else ""))
    runs = format_table(r["rows"], [
        ("strategy", "strategy", ""), ("rounds", "rounds", "d"), ("steps", "steps/worker", ".0f"),
        ("final_loss", "final loss", ".4f"), ("best_loss", "best loss", ".4f"),
        ("final_accuracy", "final acc", ".4f"), ("round_mb", "MB/round", ".3f"), ("peak_mb", "peak MB/round", ".3f"),
        ("upload_mb", "upload MB", ".2f"),
        ("total_mb", "total MB", ".2f"), ("total_x_sync", "x sync", ".1f"), ("total_x_fedavg", "x fedavg", ".2f"),
        ("upload_x_sync", "upload x sync", ".1f"), ("upload_x_fedavg", "upload x fedavg", ".2f")])
    reach = format_table(r["reach"], [
        ("target", "bytes to first reach", ""), ("strategy", "strategy", ""), ("rounds", "rounds", "d"),
        ("steps", "steps/worker", ".0f"), ("mb", "MB", ".2f"), ("x_sync", "x sync", ".1f"),
        ("x_fedavg", "x fedavg", ".2f")])
    return "\n\n".join([head, runs, reach + "\n('-' = not reached)"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=tuple(tasks()), default="digits")
    parser.add_argument("--quick", action="store_true", help="4 FedAvg rounds' worth of compute, H = 25")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=0, help="FedAvg rounds; sets every strategy's compute")
    parser.add_argument("--local-steps", type=int, default=0, help="DiLoCo's H (default per task)")
    parser.add_argument("--inner-lr", type=float, default=0.0, help="DiLoCo's AdamW lr (default per task)")
    parser.add_argument("--weight-decay", type=float, default=0.1, help="DiLoCo's AdamW weight decay")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(ORDER),
                        help=f"comma-separated strategies to run (fedavg always runs): {', '.join(ORDER)}")
    parser.add_argument("--fragments", type=int, default=4, help="fragments-int8*: fragments of the model (2 to 64)")
    parser.add_argument("--density", type=float, default=1 / 64, help="sparse: share of each chunk sent")
    parser.add_argument("--bits", type=int, default=2, help="sparse: bits per value sent")
    parser.add_argument("--step-bits", type=int, default=8, help="sparse: bits per value of the step")
    parser.add_argument("--sparse-outer-lr", type=float, default=1.0, help="sparse: outer SGD lr")
    parser.add_argument("--sparse-local-steps", type=int, default=0,
                        help="sparse, sparseloco, demo: H, inner steps per round (default: DiLoCo's)")
    parser.add_argument("--data", type=Path, default=SHAKESPEARE, help="tinyshakespeare.txt")
    add_json_flag(parser)
    args = parser.parse_args()
    stop_on_sigterm()
    args.variants = {v.strip() for v in args.variants.split(",") if v.strip()}
    if unknown := args.variants - set(ORDER):
        parser.exit(2, f"error: unknown --variants {', '.join(sorted(unknown))}\n")
    if not 2 <= args.fragments <= 64:
        parser.exit(2, "error: --fragments must be from 2 to 64\n")
    if args.task != "digits" and not args.data.is_file():
        parser.exit(2, f"error: --task {args.task} needs {args.data} (--data)\n")
    emit(run(args), args.json, render)


if __name__ == "__main__":
    main()
