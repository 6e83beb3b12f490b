"""Language models on the mesh: a 100M-parameter model's memory, bytes and round time, full
fine-tune against LoRA; and federated LoRA against central LoRA at the same compute.

Two parts, each measured side by side in one run:

* ``base``: the ``base`` llama-like model (about 100M parameters) on 4 real node processes
  (``gpuflex node start`` on 127.0.0.1), DiLoCo with the int8 codec, a few rounds of a few
  local steps, Shakespeare split by speaking role; once as a full fine-tune and once with
  LoRA. Per run: peak resident memory of each node process (VmHWM) against the fp32 size of
  the model, bytes each node sent and received per round (the nodes' own counters, before
  and after the job), and seconds per round split into compute (the slowest member's signed
  training seconds plus the root's evaluation) and the rest (planning, transfers, decoding,
  reducing, the outer step, gossip).
* ``compare``: the ``small`` model (about 10M parameters), first pre-trained centrally on the
  play and saved with ``save_pretrained`` into a directory each node's node.toml names under
  ``[models]``; then LoRA fine-tuning of that base, federated (3 node processes, one set of
  speaking roles each, DiLoCo + int8) against central (one process, all roles), with the same
  total optimizer steps and batch size. Both final adapters are scored by the same code on the
  same held-out sequences: loss and perplexity.

Run (the base part needs about 4 x 3 GB of free memory; check ``free -g`` first):

    python -m benchmarks.llm --quick             # tiny sizes: a smoke test, not figures
    python -m benchmarks.llm                     # both parts, as in BENCHMARKS.md
    python -m benchmarks.llm --part compare      # one part
    python -m benchmarks.llm --part base --adapters none --codec sparse --nodes 2 --base-rounds 3 --base-steps 1
                                                 # the full fine-tune's bytes with codec = "sparse"

``--codec`` sets the base part's codec (``sparse`` with its outer step, plain SGD at lr 1);
beside each run's bytes the table gives them against fp32 FedAvg's on the same nodes (each
member's float32 update up and the float32 model down), and the bytes each node moved
between the rounds node 0 reported in turn.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MB,
    Stopwatch,
    add_json_flag,
    emit,
    format_table,
    log,
    ratio,
    stop_on_sigterm,
)
from benchmarks.round_overhead import process_memory_mb, training_seconds

SHAKESPEARE = Path(os.environ.get("GPUFLEX_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
                   ) / "tinyshakespeare.txt"


def write_home(home: Path, text: Path, models: dict[str, str] | None = None) -> Path:
    from gpuflex.nodeconfig import dump_node_config

    home.mkdir(parents=True, exist_ok=True)
    (home / "node.toml").write_text(dump_node_config({"data": {"shakespeare": str(text)}, "models": models or {}}))
    return home


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / MB
    return float("inf")


class MemoryGuard:
    """Kills the mesh if the machine's available memory falls below ``floor_mb``: the machine
    is shared, and a benchmark must never push other people's work into the OOM killer."""

    def __init__(self, mesh: Any, floor_mb: float) -> None:
        self.mesh, self.floor_mb, self.tripped = mesh, floor_mb, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> MemoryGuard:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            free = mem_available_mb()
            if free < self.floor_mb:
                self.peaks = [round(process_memory_mb(p.pid)[1]) for p in self.mesh.procs.values()]
                self.tripped = (f"only {free:.0f} MB of memory left on the machine; stopped the mesh "
                                f"(peak RSS per node so far: {self.peaks} MB)")
                log(self.tripped)
                for i in list(self.mesh.procs):
                    self.mesh.kill(i)
                return


def mesh_job(base: Path, nodes: int, spec: dict[str, Any], text: Path, models: dict[str, str] | None,
             timeout: float, floor_mb: float = 2500.0) -> dict[str, Any]:
    """Run one job on ``nodes`` fresh node processes; ledger rows, bytes, memory, final params."""
    from gpuflex.localmesh import LocalMesh
    from gpuflex.node.core.modelblob import unpack_model

    mesh = LocalMesh(base, nodes, log_level="warning")
    guard = MemoryGuard(mesh, floor_mb)
    try:
        for i in range(nodes):
            write_home(mesh.home(i), text, models)
        mesh.start(timeout=120.0)
        mesh.wait_connected(timeout=90.0)
        idle = [process_memory_mb(p.pid)[0] for p in mesh.procs.values()]
        before = [mesh.call(i, "status") for i in range(nodes)]
        with Stopwatch() as run, guard:
            submitted = time.time()
            job = mesh.submit(spec)
            # Each node's byte counters when node 0 first reports a new round. A round's step
            # reaches the members after node 0 reports it, so an interval holds one round's
            # updates and the step of the round before.
            marks: dict[int, list[tuple[int, int]]] = {}

            def mark(state: dict[str, Any]) -> None:
                at = int(state.get("round") or 0)
                if at not in marks:
                    counters = [mesh.call(i, "status") for i in range(nodes)]
                    marks[at] = [(c["bytes_sent"], c["bytes_received"]) for c in counters]

            try:
                mesh.wait_job(job, list(range(nodes)), timeout=timeout, on_tick=mark)
            except Exception:
                if guard.tripped:
                    raise RuntimeError(guard.tripped) from None
                raise
        after = [mesh.call(i, "status") for i in range(nodes)]
        memory = [process_memory_mb(p.pid) for p in mesh.procs.values()]
        rows = mesh.call(0, "ledger", {"job": job}, timeout=30)
        seconds = training_seconds(mesh.home(0), job)
        blob = (mesh.home(0) / "blobs" / rows[-1]["model_hash"]).read_bytes()
        params, state = unpack_model(blob)
    finally:
        mesh.close()
    rounds = len(rows)
    sent = [(b["bytes_sent"] - a["bytes_sent"]) / rounds for a, b in zip(before, after, strict=True)]
    received = [(b["bytes_received"] - a["bytes_received"]) / rounds for a, b in zip(before, after, strict=True)]
    # A round's wall time runs from the previous commit (the first: from the submission, so
    # it includes every node building the model) to this one, whatever attempts it took;
    # compute is the slowest member's training plus the root's evaluation, and the rest is
    # the mesh: planning, transfers, decoding, reducing, the outer step, replay, gossip.
    per_round, previous = [], submitted
    for row in rows:
        train = max(seconds.get(row["round"], [0.0]))
        compute = train + float(row["metrics"].get("eval_seconds", 0.0))
        wall = float(row["ts"]) - previous
        previous = float(row["ts"])
        per_round.append({"round": row["round"], "attempt": row.get("attempt", 0), "duration_s": wall,
                          "train_s": train, "compute_s": compute, "mesh_s": wall - compute,
                          "loss": row["metrics"]["loss"], "perplexity": row["metrics"].get("perplexity")})
    return {"rows": per_round, "job_s": run.seconds, "params": params.copy(), "model_blob_bytes": len(blob),
            "state_keys": sorted(state), "sent_per_round": sent, "received_per_round": received,
            "round_marks": {r: marks[r] for r in sorted(marks)},
            "idle_rss_mb": idle, "rss_mb": [m[0] for m in memory], "peak_rss_mb": [m[1] for m in memory]}


# -- part 1: the base size, full fine-tune against LoRA ------------------------------------------


def base_spec(adapter: str, size: str, rounds: int, steps: int, batch: int, seq_len: int, nodes: int,
              codec: str = "int8") -> dict:
    # The sparse codec's outer step is plain SGD at lr 1 (README, "Home uplinks"): its residual
    # takes the place of outer momentum, and momentum on top of it diverged in our runs.
    outer = {"server_lr": 1.0, "server_momentum": 0.0} if codec == "sparse" else {}
    return {"name": f"bench-{size}-{adapter}", "model": "llama", "data": "shakespeare", "partition": "groups",
            "rounds": rounds, "local_epochs": 0, "local_steps": steps, "batch_size": batch, "optimizer": "adamw",
            "lr": 1e-3 if adapter == "lora" else 1e-4, "strategy": "diloco", "server_lr": 0.7,
            "server_momentum": 0.9, "codec": codec, "min_nodes": nodes, "test_fraction": 0.05,
            # Each node builds the 100M model when the job arrives (tens of seconds on a busy
            # machine): backups wait that long before planning in place of a slow coordinator.
            "plan_timeout_s": 60.0, "train_timeout_s": 600.0, "reduce_timeout_s": 30.0,
            "llm": {"size": size, "adapter": adapter, "lora_rank": 8, "seq_len": seq_len, "eval_sequences": 8},
            **outer}


def run_base(args: argparse.Namespace, text: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"size": args.base_size, "nodes": args.nodes, "rounds": args.base_rounds,
                           "local_steps": args.base_steps, "batch_size": args.base_batch, "seq_len": args.seq_len,
                           "runs": []}
    out["codec"] = args.codec
    for adapter in args.adapters.split(","):
        spec = base_spec(adapter, args.base_size, args.base_rounds, args.base_steps, args.base_batch, args.seq_len,
                         args.nodes, args.codec)
        log(f"base: {args.nodes} nodes, {args.base_size}, adapter={adapter}, codec={args.codec}: starting")
        try:
            with tempfile.TemporaryDirectory(prefix=f"gpuflex-bench-llm-{adapter}-") as tmp:
                res = mesh_job(Path(tmp), args.nodes, spec, text, None, timeout=3000.0)
        except (RuntimeError, TimeoutError) as exc:
            log(f"base: adapter={adapter}: FAILED: {exc}")
            out["runs"].append({"adapter": adapter, "error": str(exc)})
            continue
        rows = res["rows"]
        run = {
            "adapter": adapter, "trainable_params": int(res["params"].size),
            "model_blob_mb": res["model_blob_bytes"] / MB,
            "sent_mb_per_node_round": statistics.mean(res["sent_per_round"]) / MB,
            "received_mb_per_node_round": statistics.mean(res["received_per_round"]) / MB,
            # Round 1 includes every node building the model: medians over the later rounds.
            "round_s": statistics.median(r["duration_s"] for r in rows[1:] or rows),
            "compute_s": statistics.median(r["compute_s"] for r in rows[1:] or rows),
            "mesh_s": statistics.median(r["mesh_s"] for r in rows[1:] or rows),
            "retried_rounds": sum(1 for r in rows if r["attempt"]),
            "idle_rss_mb": statistics.median(res["idle_rss_mb"]), "peak_rss_mb": max(res["peak_rss_mb"]),
            "peak_rss_mb_nodes": [round(x) for x in res["peak_rss_mb"]],
            "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"], "per_round": rows, "job_s": res["job_s"],
        }
        run["traffic_mb_per_node_round"] = run["sent_mb_per_node_round"] + run["received_mb_per_node_round"]
        # Between two rounds node 0 reported in turn: each node's sent + received MB.
        marks = res["round_marks"]
        keys = sorted(marks)
        run["round_traffic_mb"] = {
            f"{a}->{b}": [round((s1 - s0 + r1 - r0) / MB, 2)
                          for (s0, r0), (s1, r1) in zip(marks[a], marks[b], strict=True)]
            for a, b in itertools.pairwise(keys)}
        log(f"base: adapter={adapter}: round {run['round_s']:.1f}s (compute {run['compute_s']:.1f}s), "
            f"{run['traffic_mb_per_node_round']:.1f} MB/node/round, peak RSS {run['peak_rss_mb']:.0f} MB")
        out["runs"].append(run)
    from gpuflex.jobspec import JobSpec
    from gpuflex.llmspec import estimate_params, model_config

    settings = JobSpec.from_dict(base_spec("none", args.base_size, 1, 1, 1, args.seq_len, args.nodes)).llm
    runs = {r["adapter"]: r for r in out["runs"] if "error" not in r}
    out["base_params"] = runs["none"]["trainable_params"] if "none" in runs else estimate_params(
        model_config(settings), 257, "llama")
    out["fp32_model_mb"] = out["base_params"] * 4 / MB
    # fp32 FedAvg by construction, on the same nodes: each of the n - 1 members sends the root
    # its float32 update and receives the float32 model, one model size each way; counted as
    # sent + received per node, the mean over the n nodes is 4 (n - 1) / n model sizes.
    n = args.nodes
    out["fp32_fedavg_mb_per_node_round"] = 4 * (n - 1) / n * out["fp32_model_mb"]
    for run in runs.values():
        run["traffic_vs_fp32_fedavg"] = ratio(run["traffic_mb_per_node_round"], out["fp32_fedavg_mb_per_node_round"])
    for run in runs.values():
        run["peak_vs_fp32"] = ratio(run["peak_rss_mb"], out["fp32_model_mb"])
        run["peak_above_idle_vs_fp32"] = ratio(run["peak_rss_mb"] - run["idle_rss_mb"], out["fp32_model_mb"])
    if len(runs) == 2:
        full, lora = runs["none"], runs["lora"]
        out["lora_traffic_vs_full"] = ratio(lora["traffic_mb_per_node_round"], full["traffic_mb_per_node_round"])
        out["lora_params_vs_full"] = ratio(lora["trainable_params"], full["trainable_params"])
    return out


# -- part 2: federated LoRA against central LoRA ----------------------------------------------


def compare_spec(model: str, partition: str, rounds: int, steps: int, args: argparse.Namespace,
                 **llm: Any) -> dict[str, Any]:
    return {"name": f"bench-{args.compare_size}-{partition}", "model": model, "data": "shakespeare",
            "partition": partition, "rounds": rounds, "local_epochs": 0, "local_steps": steps,
            "batch_size": args.compare_batch, "optimizer": "adamw", "lr": llm.pop("lr", 2e-3),
            "strategy": "diloco", "server_lr": 0.7, "server_momentum": 0.9, "codec": "int8",
            "min_nodes": args.compare_nodes, "test_fraction": 0.1, "plan_timeout_s": 30.0, "train_timeout_s": 600.0,
            "llm": {"size": args.compare_size, "seq_len": args.compare_seq_len, "eval_sequences": args.eval_sequences,
                    **llm}}


def pretrain(home: Path, args: argparse.Namespace) -> tuple[Path, dict[str, float]]:
    """The ``small`` base, trained centrally on the play and saved as a [models] directory."""
    from gpuflex.jobspec import JobSpec
    from gpuflex.ml.llm.pin import pin_llm_spec
    from gpuflex.ml.llm.workload import LLMWorkload

    spec = pin_llm_spec(JobSpec.from_dict(compare_spec("llama", "iid", 1, args.pretrain_steps, args, adapter="none",
                                                       lr=1e-3)), home)
    work = LLMWorkload(spec, 0, 1, home)
    params = work.initial_params()
    with Stopwatch() as sw:
        delta, _ = work.train(params)
    params += delta
    scores = work.evaluate(params)
    work.export_model(params, home / "pretrained")
    log(f"compare: pre-trained {args.pretrain_steps} steps in {sw.seconds:.0f}s: held-out loss {scores['loss']:.3f}")
    return home / "pretrained" / "model", {"loss": scores["loss"], "perplexity": scores["perplexity"],
                                           "seconds": sw.seconds}


def run_compare(args: argparse.Namespace, text: Path) -> dict[str, Any]:
    from gpuflex.jobspec import JobSpec
    from gpuflex.ml.llm.pin import pin_llm_spec
    from gpuflex.ml.llm.workload import LLMWorkload

    n, rounds, steps = args.compare_nodes, args.compare_rounds, args.compare_steps
    total = n * rounds * steps
    with tempfile.TemporaryDirectory(prefix="gpuflex-bench-llm-compare-") as tmp:
        home = write_home(Path(tmp) / "central", text)
        base_dir, pre = pretrain(home, args)
        models = {"shakespeare-small": str(base_dir)}
        write_home(home, text, models)
        lora = {"pretrained": "shakespeare-small", "adapter": "lora", "lora_rank": 8}
        central_spec = pin_llm_spec(JobSpec.from_dict(compare_spec("pretrained", "iid", 1, total, args, **lora)),
                                    home)
        central = LLMWorkload(central_spec, 0, 1, home)
        init = central.initial_params()
        before = central.evaluate(init)
        with Stopwatch() as sw:
            delta, _ = central.train(init)
        central_scores = central.evaluate(init + delta)
        log(f"compare: central LoRA, {total} steps in {sw.seconds:.0f}s: loss {central_scores['loss']:.4f}")
        fed_spec = compare_spec("pretrained", "groups", rounds, steps, args, **lora)
        log(f"compare: federated LoRA, {n} nodes x {rounds} rounds x {steps} steps: starting")
        fed = mesh_job(Path(tmp) / "mesh", n, fed_spec, text, models, timeout=3000.0)
        fed_scores = central.evaluate(fed["params"])  # the same code, the same held-out rows
        log(f"compare: federated LoRA in {fed['job_s']:.0f}s: loss {fed_scores['loss']:.4f}")
    return {
        "size": args.compare_size, "nodes": n, "rounds": rounds, "local_steps": steps, "total_steps": total,
        "batch_size": args.compare_batch, "seq_len": args.compare_seq_len, "eval_sequences": args.eval_sequences,
        "pretrain": pre, "lora_start": before,
        "central": {**central_scores, "seconds": sw.seconds},
        "federated": {**fed_scores, "seconds": fed["job_s"], "per_round": fed["rows"]},
        "perplexity_ratio": ratio(fed_scores["perplexity"], central_scores["perplexity"]),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    text = SHAKESPEARE
    if not text.is_file():
        raise SystemExit(f"{text} not found; set GPUFLEX_SHARED_DATA to the folder holding tinyshakespeare.txt")
    out: dict[str, Any] = {"benchmark": "llm", "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(),
                           "load_before": os.getloadavg()}
    if args.part in ("base", "all"):
        out["base"] = run_base(args, text)
    if args.part in ("compare", "all"):
        out["compare"] = run_compare(args, text)
    return out


def render(result: dict[str, Any]) -> str:
    lines = [f"Language models, {result['date']}, {result['cores']} cores, load before the run "
             f"{', '.join(f'{x:.1f}' for x in result['load_before'])}"]
    if "base" in result:
        b = result["base"]
        lines += [
            f"\n`{b['size']}` llama-like model, {b['base_params'] / 1e6:.1f}M parameters "
            f"({b['fp32_model_mb']:.0f} MB in "
            f"fp32); {b['nodes']} node processes; DiLoCo + {b.get('codec', 'int8')}; {b['rounds']} rounds x "
            f"{b['local_steps']} steps of "
            f"{b['batch_size']} x {b['seq_len']} tokens; round times are medians over rounds 2 and later "
            "(commit to commit)",
            format_table([r for r in b["runs"] if "error" not in r], [
                ("adapter", "adapter", ""), ("trainable_params", "trainable params", ",d"),
                ("model_blob_mb", "model blob MB", ".2f"), ("sent_mb_per_node_round", "sent MB/node/round", ".2f"),
                ("received_mb_per_node_round", "received MB/node/round", ".2f"),
                ("round_s", "round s", ".1f"), ("compute_s", "compute s", ".1f"), ("mesh_s", "mesh s", ".1f"),
                ("retried_rounds", "retried rounds", "d"),
                ("idle_rss_mb", "idle RSS MB", ".0f"), ("peak_rss_mb", "peak RSS MB", ".0f"),
                ("peak_vs_fp32", "peak / fp32 model", ".1f"),
                ("peak_above_idle_vs_fp32", "(peak - idle) / fp32", ".1f"),
                ("loss_first", "loss r1", ".3f"), ("loss_last", "loss last", ".3f")]),
            *(f"{r['adapter']}: traffic / fp32 FedAvg's ({b['fp32_fedavg_mb_per_node_round']:.0f} MB/node/round) = "
              f"{100 * r['traffic_vs_fp32_fedavg']:.2f}% (goal <= 2%)" for r in b["runs"] if "error" not in r),
            *([f"LoRA traffic / full fine-tune traffic = {b['lora_traffic_vs_full']:.4f} "
               f"({100 * b['lora_traffic_vs_full']:.2f}%, goal < 2%); trainable parameters "
               f"{100 * b['lora_params_vs_full']:.2f}% of the model."] if "lora_traffic_vs_full" in b else []),
            *(f"{r['adapter']}: sent + received MB per node between rounds node 0 reported: {r['round_traffic_mb']}"
              for r in b["runs"] if "error" not in r),
            "Peak RSS per node: " + "; ".join(f"{r['adapter']} {r['peak_rss_mb_nodes']}" for r in b["runs"]
                                              if "error" not in r),
            *(f"adapter={r['adapter']}: FAILED: {r['error']}" for r in b["runs"] if "error" in r),
        ]
    if "compare" in result:
        c = result["compare"]
        rows = [{"run": "pre-trained base (no adapter)", **c["lora_start"]},
                {"run": f"central LoRA, 1 process, {c['total_steps']} steps", **c["central"]},
                {"run": f"federated LoRA, {c['nodes']} nodes by role, {c['rounds']} x {c['local_steps']} steps each",
                 **c["federated"]}]
        lines += [
            f"\n`{c['size']}` base pre-trained {c['pretrain']['seconds']:.0f}s centrally, then LoRA (rank 8) with "
            f"the same total steps ({c['total_steps']} x batch {c['batch_size']} x {c['seq_len']} tokens); "
            f"held-out loss on the same {c['eval_sequences']} sequences",
            format_table(rows, [("run", "run", ""), ("loss", "held-out loss", ".4f"),
                                ("perplexity", "perplexity", ".3f"), ("accuracy", "next-token acc", ".3f"),
                                ("seconds", "seconds", ".0f")]),
            f"federated / central perplexity = {c['perplexity_ratio']:.4f} (goal: within 5%)",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    stop_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("base", "compare", "all"), default="all")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the harness")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--base-size", default="base")
    p.add_argument("--base-rounds", type=int, default=3)
    p.add_argument("--base-steps", type=int, default=2)
    p.add_argument("--base-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--codec", choices=("int8", "sparse", "none"), default="int8", help="the base part's codec")
    p.add_argument("--adapters", default="lora,none", help="the base part's runs: lora, none (full), or both")
    p.add_argument("--compare-size", default="small")
    p.add_argument("--compare-nodes", type=int, default=3)
    p.add_argument("--compare-rounds", type=int, default=3)
    p.add_argument("--compare-steps", type=int, default=10)
    p.add_argument("--compare-batch", type=int, default=8)
    p.add_argument("--compare-seq-len", type=int, default=64)
    p.add_argument("--pretrain-steps", type=int, default=80)
    p.add_argument("--eval-sequences", type=int, default=128)
    add_json_flag(p)
    args = p.parse_args(argv)
    if args.quick:
        args.base_size = args.compare_size = "tiny"
        args.base_rounds, args.base_steps, args.seq_len, args.compare_seq_len = 2, 2, 64, 64
        args.compare_rounds, args.compare_steps, args.pretrain_steps, args.eval_sequences = 2, 3, 20, 32
    emit(run(args), args.json, render)


if __name__ == "__main__":
    main()
