"""Adding a slow machine to a mesh: fixed local work against time-budgeted rounds with FedNova.

Real node processes (``LocalMesh``) train one job; one of them is held to a tenth of a core,
by a cgroup v1 CPU quota where the machine has one (else by stopping and continuing the
process on a 10 % duty cycle, which says so in the output). The job is next-character
prediction on Shakespeare (``char-gru``, plain SGD, ``GPUFLEX_SHARED_DATA`` or
``../shared/data``), or with ``--data digits`` the digits demo. Side by side in one run, each
on a fresh mesh:

* ``fast``: the fast nodes alone, with the time budget: the mesh before the slow machine came;
* ``fixed``: all nodes, the slow one included, fixed local work (the design before budgets);
* ``budget``: all nodes, ``compute_budget_s`` with FedNova (each member trains for the budget
  and its update is normalised by its local steps);
* ``budget-plain`` (``--with-plain``): the same budget, normalization = "none" (plain FedAvg
  of unequal work), to show what FedNova changes.

Every variant's job needs ``min_nodes`` = the fast nodes only, so a job starts as soon as they
are ready; the slow node joins its rounds when it is.

The fast nodes are each held to ``--fast-cores`` (0.6) of a core by their own quota, so the
nodes' needs fit a 2-core machine (3 × 0.6 + 0.1): on separate machines the slow node takes no
CPU from the fast ones, and here it otherwise did. ``--repeat N`` runs every variant N times,
interleaved, and reports medians.

For each it reports, from node 0's ledger (each contributor's signed training seconds and
steps, each round's commit time and test accuracy):

* compute utilisation as the issue defines it: the members' summed training seconds over
  (members × wall time), wall time running from the first plan to the last commit (each
  stretch between two commits counted for the members planned in that round); a member whose
  update was left out counts as zero. ``round util`` is the same over the rounds' own
  plan-to-commit durations (without the gaps between rounds);
* the mean round time, and how many rounds counted the slow member;
* wall time from the job's submission to the first round at ``--target`` test accuracy, the
  same counting from the first plan (without the members' start on the job), and the final
  accuracy.

``--cuda-member K`` runs node K on CUDA (the others see no GPU) and prints the settings it
chose (precision, micro-batch, threads) and its throughput against the CPU members'.

Run:

    python -m benchmarks.heterogeneity [--nodes 4] [--rounds 8] [--budget-s 12] [--repeat 3] [--with-plain]
                                       [--data shakespeare|digits] [--cuda-member 0] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import add_json_flag, emit, format_table, log, ratio, stop_on_sigterm
from gpuflex.cpuquota import CpuQuota, QuotaUnavailable
from gpuflex.localmesh import LocalMesh, Placement

SLOW_CORES = 0.1


class DutyCycle:
    """Holds a process to ``share`` of the time by SIGSTOP/SIGCONT, where no cgroup quota can
    be made (cgroup v2 only, or not root): cruder than a quota, but it slows the same way."""

    def __init__(self, pid: int, share: float, period_s: float = 0.1) -> None:
        self.pid, self.run_s, self.stop_s = pid, share * period_s, (1 - share) * period_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            while not self._done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self._done.wait(self.stop_s)
                os.kill(self.pid, signal.SIGCONT)
                self._done.wait(self.run_s)

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


@contextlib.contextmanager
def throttled(pid: int, cores: float = SLOW_CORES, crude: bool = True) -> Iterator[str]:
    """Hold ``pid`` to ``cores`` of one core until the block ends; yields how. Without a cgroup
    quota, a duty cycle if ``crude`` (the slow node), else nothing (a fast node)."""
    try:
        quota = CpuQuota(cores, name="gpuflex-bench")
    except QuotaUnavailable as exc:
        if not crude:
            yield "no limit"
            return
        log(f"no cgroup quota ({exc}); using a SIGSTOP/SIGCONT duty cycle")
        cycle = DutyCycle(pid, cores)
        try:
            yield f"duty cycle {cores:.0%}"
        finally:
            cycle.close()
        return
    with quota:
        quota.add(pid)
        yield f"cgroup v1 quota {cores:.0%} of a core"


@contextlib.contextmanager
def shares(pids: list[int], slow: int | None, fast_cores: float) -> Iterator[str]:
    """Each node's share of the machine until the block ends: the slow node ``SLOW_CORES`` of a
    core, the others ``fast_cores`` each (0: no limit). On one 2-core machine the fast nodes
    would otherwise share the cores the slow node also takes, which separate machines do not:
    the fast nodes ran up to a tenth slower with the slow node beside them."""
    with contextlib.ExitStack() as stack:
        how = [stack.enter_context(throttled(pids[slow]))] if slow is not None else ["none"]
        if fast_cores > 0:
            fast = [stack.enter_context(throttled(pid, fast_cores, crude=False))
                    for i, pid in enumerate(pids) if i != slow]
            how.append(f"fast nodes {fast[0]}" if fast else "")
        yield "; ".join(h for h in how if h)


SHARED_TEXT = Path(os.environ.get("GPUFLEX_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
                   ) / "tinyshakespeare.txt"


def job_spec(variant: str, args: argparse.Namespace, fast_nodes: int) -> dict[str, Any]:
    from gpuflex.jobspec import JobSpec, example_job_toml, tomllib

    data = tomllib.loads(example_job_toml())
    data.update(name=f"bench-hetero-{variant}", rounds=args.rounds, min_nodes=fast_nodes, group_size=2)
    if args.data == "shakespeare":
        # Plain SGD at LEAF's learning rate for a character model; a small test split keeps
        # the root's evaluation short.
        data.update(model="char-gru", data="shakespeare", partition="iid", optimizer="sgd", lr=1.0,
                    test_fraction=0.05, local_epochs=1, local_steps=args.fixed_steps)
    else:
        data.update(local_epochs=args.epochs, local_steps=0)
    if variant in ("fast", "budget", "budget-plain"):
        data.update(compute_budget_s=args.budget_s, local_steps=0,
                    normalization="none" if variant == "budget-plain" else "fednova")
    return JobSpec.from_dict(data).to_dict()


def run_variant(variant: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    fast_nodes = args.nodes - 1
    nodes = fast_nodes if variant == "fast" else args.nodes
    slow = None if variant == "fast" else nodes - 1
    cuda = args.cuda_member

    def place(i: int) -> Placement:  # with --cuda-member, only that node sees the GPU
        return Placement(prefix=("env", "CUDA_VISIBLE_DEVICES=")) if cuda is not None and i != cuda else Placement()

    extra = ["--data", f"shakespeare={args.text}"] if args.data == "shakespeare" else []
    log(f"{variant}: {nodes} nodes" + (f", node {slow} at {SLOW_CORES:.0%} of a core" if slow is not None else ""))
    with LocalMesh(base / variant, nodes, extra_args=extra, placement=place,
                   log_level="info" if args.keep else "warning") as mesh:
        mesh.start(timeout=180)
        mesh.wait_connected(120)
        ids = [mesh.call(i, "status")["peer_id"] for i in range(nodes)]
        with shares([mesh.procs[i].pid for i in range(nodes)], slow, args.fast_cores) as how:
            submitted = time.time()
            job = mesh.submit(job_spec(variant, args, fast_nodes))
            mesh.wait_job(job, list(range(nodes)), timeout=args.timeout)
            rows = mesh.call(0, "ledger", {"job": job})
            fits = [mesh.job(i, job).get("fit", {}) for i in range(nodes)]
    return summarise(variant, rows, submitted, ids, slow, args.target, how, fits, cuda)


def summarise(variant: str, rows: list[dict[str, Any]], submitted: float, ids: list[str], slow: int | None,
              target: float, how: str, fits: list[dict[str, Any]], cuda: int | None) -> dict[str, Any]:
    durations = [float(r["metrics"]["duration_s"]) for r in rows]
    members = [len(r["contributors"]) + len(r["absent"]) for r in rows]
    compute = sum(float(c.get("compute_s", 0.0)) for r in rows for c in r["contributors"])
    # Wall time from the first plan; each stretch up to a commit counted for that round's members.
    began = rows[0]["ts"] - durations[0] if rows else float("nan")
    stretches = [r["ts"] - prev for r, prev in zip(rows, [began, *(r["ts"] for r in rows[:-1])], strict=True)]
    reached = next((r for r in rows if r["metrics"]["accuracy"] >= target), None)
    out: dict[str, Any] = {
        "variant": variant, "nodes": len(ids), "rounds": len(rows), "throttle": how,
        "utilisation": ratio(compute, sum(m * w for m, w in zip(members, stretches, strict=True))),
        "round_utilisation": ratio(compute, sum(m * d for m, d in zip(members, durations, strict=True))),
        "round_s": statistics.mean(durations) if durations else float("nan"),
        "to_target_s": reached["ts"] - submitted if reached else float("nan"),
        # The same from the first plan (without the members' start on the job: loading data and
        # probing their device, slow on the throttled node).
        "rounds_to_target_s": reached["ts"] - began if reached else float("nan"),
        "start_s": began - submitted if rows else float("nan"),
        "target_round": reached["round"] if reached else None,
        "final_accuracy": rows[-1]["metrics"]["accuracy"] if rows else float("nan"),
        "planned_members": sum(members),
        "accuracy_by_round": [round(float(r["metrics"]["accuracy"]), 4) for r in rows],
        "round_s_by_round": [round(d, 3) for d in durations],
    }
    if slow is not None:
        slow_id = ids[slow]
        mine = [c for r in rows for c in r["contributors"] if c["peer"] == slow_id]
        out["slow_counted"] = f"{len(mine)}/{len(rows)}"
        out["slow_steps"] = statistics.mean(c.get("steps", 0) for c in mine) if mine else 0.0
        out["slow_compute_s"] = statistics.mean(float(c.get("compute_s", 0.0)) for c in mine) if mine else 0.0
    others = [c for r in rows for c in r["contributors"] if slow is None or c["peer"] != ids[slow]]
    out["fast_steps"] = statistics.mean(c.get("steps", 0) for c in others) if others else 0.0
    out["fast_compute_s"] = statistics.mean(float(c.get("compute_s", 0.0)) for c in others) if others else 0.0
    if cuda is not None:
        rates = {ids[i]: [c.get("samples_per_s", 0.0) for r in rows for c in r["contributors"] if c["peer"] == ids[i]]
                 for i in range(len(ids))}
        out["cuda"] = {"fit": fits[cuda], "samples_per_s": {
            ("cuda" if i == cuda else f"cpu{i}" + ("-slow" if i == slow else "")):
                statistics.median(rates[ids[i]]) if rates[ids[i]] else 0.0 for i in range(len(ids))}}
    return out


COLUMNS = [("variant", "variant", ""), ("nodes", "nodes", "d"), ("rounds", "rounds", "d"),
           ("round_s", "round s", ".2f"), ("utilisation", "utilisation", ".2f"),
           ("round_utilisation", "round util", ".2f"),
           ("start_s", "start s", ".1f"), ("to_target_s", "s to target", ".1f"),
           ("rounds_to_target_s", "s to target from plan", ".1f"), ("target_round", "at round", ""),
           ("final_accuracy", "final acc", ".3f"), ("slow_counted", "slow counted", ""),
           ("slow_steps", "slow steps", ".1f"), ("fast_steps", "fast steps", ".1f")]


#: Per-run figures a repeated variant reports the median of (a run that never reached the
#: target counts as infinitely late).
MEDIANS = ("rounds", "utilisation", "round_utilisation", "round_s", "to_target_s", "rounds_to_target_s", "start_s",
           "target_round", "final_accuracy", "slow_steps", "slow_compute_s", "fast_steps", "fast_compute_s")


def combine(variant: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for ``runs`` of a variant: the median of each figure, and every run under ``runs``."""
    ok = [r for r in runs if "error" not in r]
    if len(runs) == 1 or not ok:
        return runs[0] if len(runs) == 1 else {**runs[0], "runs": runs}
    out: dict[str, Any] = {"variant": variant, "nodes": ok[0]["nodes"], "throttle": ok[0]["throttle"],
                           "repeats": len(ok), "failed_runs": len(runs) - len(ok)}
    for key in MEDIANS:
        values = [r.get(key) for r in ok]
        if key in ("to_target_s", "rounds_to_target_s", "target_round"):
            values = [math.inf if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values]
        numbers = [float(v) for v in values if isinstance(v, (int, float))]
        if numbers:
            mid = statistics.median(numbers)
            out[key] = int(mid) if key in ("rounds", "target_round") and mid.is_integer() else mid
    if all("slow_counted" in r for r in ok):
        parts = [tuple(map(int, r["slow_counted"].split("/"))) for r in ok]
        out["slow_counted"] = f"{sum(a for a, _ in parts)}/{sum(b for _, b in parts)}"
    out["runs"] = runs
    return out


def render(result: dict[str, Any]) -> str:
    rows = result["variants"]
    by = {r["variant"]: r for r in rows if "error" not in r}
    lines = [f"heterogeneity: {result['nodes']} nodes, one at {SLOW_CORES:.0%} of a core "
             f"({rows[-1]['throttle']}); {result['data']}; {result['rounds']} rounds; budget {result['budget_s']:g} s; "
             f"target accuracy {result['target']:.2f}; load before {result['load_before']}",
             "", format_table(rows, COLUMNS), ""]
    for other in ("fast", "fixed", "budget-plain"):
        if "budget" in by and other in by:
            b, o = by["budget"], by[other]
            lines.append(f"budget / {other}: time to target {ratio(b['to_target_s'], o['to_target_s']):.2f}, "
                         f"from the first plan {ratio(b['rounds_to_target_s'], o['rounds_to_target_s']):.2f}, "
                         f"round time {ratio(b['round_s'], o['round_s']):.2f}, "
                         f"utilisation {ratio(b['utilisation'], o['utilisation']):.2f}")
    for r in rows:
        if "runs" in r:
            each = "; ".join(f"{x['to_target_s']:.1f} s, util {x['utilisation']:.2f}" if "error" not in x else "failed"
                             for x in r["runs"])
            lines.append(f"{r['variant']}: median of {len(r['runs'])} runs; each run's time to target and "
                         f"utilisation: {each}")
        if "error" in r:
            lines.append(f"{r['variant']}: FAILED: {r['error']}")
        if "cuda" in r:
            lines.append(f"{r['variant']}: CUDA member chose {r['cuda']['fit'].get('summary', r['cuda']['fit'])}; "
                         f"median samples/s per member: {r['cuda']['samples_per_s']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4, help="nodes with the slow one (the fast variant has one fewer)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--data", choices=("shakespeare", "digits"), default="shakespeare",
                        help="the job: next-character Shakespeare (char-gru), or the digits demo")
    parser.add_argument("--budget-s", type=float, default=12.0,
                        help="compute_budget_s of the budgeted variants (the slow node's fixed cost per round, "
                             "about 1.5 s at a tenth of a core, is paid out of it)")
    parser.add_argument("--epochs", type=int, default=2, help="local_epochs of the fixed digits variant")
    parser.add_argument("--fixed-steps", type=int, default=20, help="local_steps of the fixed Shakespeare variant")
    parser.add_argument("--target", type=float, default=None,
                        help="test accuracy the time-to-target is taken at (0.38 Shakespeare, 0.90 digits)")
    parser.add_argument("--with-plain", action="store_true", help="also run the budget without FedNova")
    parser.add_argument("--variants", default="", metavar="LIST",
                        help="run only these, comma-separated (fast, fixed, budget, budget-plain)")
    parser.add_argument("--cuda-member", type=int, default=None, metavar="K",
                        help="node K trains on CUDA, the others on the CPU")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each variant's job may take")
    parser.add_argument("--quick", action="store_true", help="3 nodes, 3 rounds, 1.5 s budget: a smoke test")
    parser.add_argument("--fast-cores", type=float, default=0.6, metavar="C",
                        help="hold each fast node to C cores by a cgroup quota, so the nodes' needs fit the machine "
                             "(3 × 0.6 + 0.1 on 2 cores); 0: no limit")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run every variant N times, interleaved, and report medians (a single run's time to "
                             "target varies by a round or two)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="run the meshes in DIR and keep their homes, with info-level node logs")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.target is None:
        args.target = 0.38 if args.data == "shakespeare" else 0.9
    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    if args.quick:
        args.nodes, args.rounds, args.budget_s, args.target = 3, 3, 1.5, 0.2 if args.data == "shakespeare" else 0.5
    args.text = SHARED_TEXT
    if args.data == "shakespeare" and not SHARED_TEXT.is_file():
        raise SystemExit(f"{SHARED_TEXT} not found; set GPUFLEX_SHARED_DATA to the folder holding "
                         "tinyshakespeare.txt, or run with --data digits")
    stop_on_sigterm()
    variants = ["fast", "fixed", "budget"] + (["budget-plain"] if args.with_plain else [])
    if args.variants:
        variants = [v for v in args.variants.split(",") if v]
        unknown = sorted(set(variants) - {"fast", "fixed", "budget", "budget-plain"})
        if unknown:
            raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; expected fast, fixed, budget, budget-plain")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with (contextlib.nullcontext(str(args.keep)) if args.keep else
          tempfile.TemporaryDirectory(prefix="gpuflex-hetero-")) as tmp:
        # Repeats interleave the variants, so a change in the machine's load falls on all alike.
        for k in range(args.repeat):
            for v in variants:  # a variant that fails is reported as such; the others still run
                if args.repeat > 1:
                    log(f"run {k + 1} of {args.repeat}")
                try:
                    runs[v].append(run_variant(v, args, Path(tmp) / f"run{k + 1}"))
                except (RuntimeError, OSError) as exc:
                    log(f"{v}: failed: {exc}")
                    runs[v].append({"variant": v, "throttle": "", "error": str(exc)[:300]})
    rows = [combine(v, runs[v]) for v in variants]
    emit({"benchmark": "heterogeneity", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "nodes": args.nodes, "rounds": args.rounds, "budget_s": args.budget_s, "target": args.target,
          "repeat": args.repeat,
          "data": args.data,
          "load_before": load, "variants": rows}, args.json, render)


if __name__ == "__main__":
    main()
