"""Adding a slow machine to a mesh: fixed local work against time-budgeted rounds with FedNova.

Real node processes (``LocalMesh``) train the digits job; one of them is held to a tenth of a
core, by a cgroup v1 CPU quota where the machine has one (else by stopping and continuing the
process on a 10 % duty cycle, which says so in the output). Side by side in one run, each on
a fresh mesh:

* ``fast``: the fast nodes alone, fixed local epochs (the design before time budgets);
* ``fixed``: all nodes, the slow one included, fixed local epochs;
* ``budget``: all nodes, ``compute_budget_s`` with FedNova (each member trains for the budget
  and its update is normalised by its local steps);
* ``budget-plain`` (``--with-plain``): the same budget, normalization = "none" (plain FedAvg
  of unequal work), to show what FedNova changes.

For each it reports, from node 0's ledger (each contributor's signed training seconds and
steps, each round's plan-to-commit duration and test accuracy):

* compute utilisation: the sum of the members' training seconds over (plan members × the sum
  of the rounds' durations); a member whose update was left out counts as zero;
* the mean round time, and the slowest member's share of the rounds it was planned in;
* wall time from the job's submission to the first round at ``--target`` test accuracy, the
  same counting the rounds' durations only (without the members' start on the job, which the
  throttled node makes slow), and the final accuracy.

``--cuda-member K`` runs node K on CUDA (the others see no GPU) and prints the settings it
chose (precision, micro-batch, threads) and its throughput against the CPU members'.

Run:

    python -m benchmarks.heterogeneity [--nodes 4] [--rounds 8] [--budget-s 3] [--with-plain]
                                       [--cuda-member 0] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
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
def throttled(pid: int) -> Iterator[str]:
    """Hold ``pid`` to SLOW_CORES of one core until the block ends; yields how."""
    try:
        quota = CpuQuota(SLOW_CORES, name="gpuflex-bench")
    except QuotaUnavailable as exc:
        log(f"no cgroup quota ({exc}); using a SIGSTOP/SIGCONT duty cycle")
        cycle = DutyCycle(pid, SLOW_CORES)
        try:
            yield f"duty cycle {SLOW_CORES:.0%}"
        finally:
            cycle.close()
        return
    with quota:
        quota.add(pid)
        yield f"cgroup v1 quota {SLOW_CORES:.0%} of a core"


def job_spec(variant: str, nodes: int, rounds: int, budget_s: float, epochs: int) -> dict[str, Any]:
    from gpuflex.jobspec import JobSpec, example_job_toml, tomllib

    data = tomllib.loads(example_job_toml())
    data.update(name=f"bench-hetero-{variant}", rounds=rounds, min_nodes=nodes, group_size=2,
                local_epochs=epochs, local_steps=0)
    if variant.startswith("budget"):
        data.update(compute_budget_s=budget_s, normalization="none" if variant == "budget-plain" else "fednova")
    return JobSpec.from_dict(data).to_dict()


def run_variant(variant: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    nodes = args.nodes - 1 if variant == "fast" else args.nodes
    slow = None if variant == "fast" else nodes - 1
    cuda = args.cuda_member

    def place(i: int) -> Placement:  # with --cuda-member, only that node sees the GPU
        return Placement(prefix=("env", "CUDA_VISIBLE_DEVICES=")) if cuda is not None and i != cuda else Placement()

    log(f"{variant}: {nodes} nodes" + (f", node {slow} at {SLOW_CORES:.0%} of a core" if slow is not None else ""))
    with LocalMesh(base / variant, nodes, placement=place, log_level="warning") as mesh:
        mesh.start(timeout=180)
        mesh.wait_connected(120)
        ids = [mesh.call(i, "status")["peer_id"] for i in range(nodes)]
        with throttled(mesh.procs[slow].pid) if slow is not None else contextlib.nullcontext("none") as how:
            submitted = time.time()
            job = mesh.submit(job_spec(variant, nodes, args.rounds, args.budget_s, args.epochs))
            mesh.wait_job(job, list(range(nodes)), timeout=args.timeout)
            rows = mesh.call(0, "ledger", {"job": job})
            fits = [mesh.job(i, job).get("fit", {}) for i in range(nodes)]
    return summarise(variant, rows, submitted, ids, slow, args.target, how, fits, cuda)


def summarise(variant: str, rows: list[dict[str, Any]], submitted: float, ids: list[str], slow: int | None,
              target: float, how: str, fits: list[dict[str, Any]], cuda: int | None) -> dict[str, Any]:
    durations = [float(r["metrics"]["duration_s"]) for r in rows]
    planned = sum(len(r["contributors"]) + len(r["absent"]) for r in rows)
    compute = sum(float(c.get("compute_s", 0.0)) for r in rows for c in r["contributors"])
    member_rounds = sum((len(r["contributors"]) + len(r["absent"])) * d for r, d in zip(rows, durations, strict=True))
    reached = next((r for r in rows if r["metrics"]["accuracy"] >= target), None)
    out: dict[str, Any] = {
        "variant": variant, "nodes": len(ids), "rounds": len(rows), "throttle": how,
        "utilisation": ratio(compute, member_rounds),
        "round_s": statistics.mean(durations) if durations else float("nan"),
        "to_target_s": reached["ts"] - submitted if reached else float("nan"),
        # The same without the job's start (members loading data and probing their device,
        # slow on the throttled node): the rounds' own durations up to the target.
        "rounds_to_target_s": sum(durations[: reached["round"]]) if reached else float("nan"),
        "start_s": rows[0]["ts"] - durations[0] - submitted if rows else float("nan"),
        "target_round": reached["round"] if reached else None,
        "final_accuracy": rows[-1]["metrics"]["accuracy"] if rows else float("nan"),
        "planned_members": planned,
    }
    if slow is not None:
        slow_id = ids[slow]
        mine = [c for r in rows for c in r["contributors"] if c["peer"] == slow_id]
        out["slow_counted"] = f"{len(mine)}/{len(rows)}"
        out["slow_steps"] = statistics.mean(c.get("steps", 0) for c in mine) if mine else 0.0
        fast = [c.get("steps", 0) for r in rows for c in r["contributors"] if c["peer"] != slow_id]
        out["fast_steps"] = statistics.mean(fast) if fast else 0.0
    if cuda is not None:
        rates = {ids[i]: [c.get("samples_per_s", 0.0) for r in rows for c in r["contributors"] if c["peer"] == ids[i]]
                 for i in range(len(ids))}
        out["cuda"] = {"fit": fits[cuda], "samples_per_s": {
            ("cuda" if i == cuda else f"cpu{i}" + ("-slow" if i == slow else "")):
                statistics.median(rates[ids[i]]) if rates[ids[i]] else 0.0 for i in range(len(ids))}}
    return out


COLUMNS = [("variant", "variant", ""), ("nodes", "nodes", "d"), ("rounds", "rounds", "d"),
           ("round_s", "round s", ".2f"), ("utilisation", "utilisation", ".2f"),
           ("start_s", "start s", ".1f"), ("to_target_s", "s to target", ".1f"),
           ("rounds_to_target_s", "round s to target", ".1f"), ("target_round", "at round", ""),
           ("final_accuracy", "final acc", ".3f"), ("slow_counted", "slow counted", ""),
           ("slow_steps", "slow steps", ".1f"), ("fast_steps", "fast steps", ".1f")]


def render(result: dict[str, Any]) -> str:
    rows = result["variants"]
    by = {r["variant"]: r for r in rows if "error" not in r}
    lines = [f"heterogeneity: {result['nodes']} nodes, one at {SLOW_CORES:.0%} of a core "
             f"({rows[-1]['throttle']}); {result['rounds']} rounds; budget {result['budget_s']:g} s; "
             f"target accuracy {result['target']:.2f}; load before {result['load_before']}",
             "", format_table(rows, COLUMNS), ""]
    for other in ("fast", "fixed", "budget-plain"):
        if "budget" in by and other in by:
            b, o = by["budget"], by[other]
            lines.append(f"budget / {other}: time to target {ratio(b['to_target_s'], o['to_target_s']):.2f}, "
                         f"round time to target {ratio(b['rounds_to_target_s'], o['rounds_to_target_s']):.2f}, "
                         f"round time {ratio(b['round_s'], o['round_s']):.2f}, "
                         f"utilisation {ratio(b['utilisation'], o['utilisation']):.2f}")
    for r in rows:
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
    parser.add_argument("--budget-s", type=float, default=3.0, help="compute_budget_s of the budgeted variants")
    parser.add_argument("--epochs", type=int, default=2, help="local_epochs of the fixed variants")
    parser.add_argument("--target", type=float, default=0.9, help="test accuracy the time-to-target is taken at")
    parser.add_argument("--with-plain", action="store_true", help="also run the budget without FedNova")
    parser.add_argument("--cuda-member", type=int, default=None, metavar="K",
                        help="node K trains on CUDA, the others on the CPU")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each variant's job may take")
    parser.add_argument("--quick", action="store_true", help="3 nodes, 3 rounds, 1.5 s budget: a smoke test")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.rounds, args.budget_s, args.target = 3, 3, 1.5, 0.5
    stop_on_sigterm()
    variants = ["fast", "fixed", "budget"] + (["budget-plain"] if args.with_plain else [])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="gpuflex-hetero-") as tmp:
        rows = []
        for v in variants:  # a variant that fails is reported as such; the others still run
            try:
                rows.append(run_variant(v, args, Path(tmp)))
            except (RuntimeError, OSError) as exc:
                log(f"{v}: failed: {exc}")
                rows.append({"variant": v, "throttle": "", "error": str(exc)[:300]})
    emit({"benchmark": "heterogeneity", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "nodes": args.nodes, "rounds": args.rounds, "budget_s": args.budget_s, "target": args.target,
          "load_before": load, "variants": rows}, args.json, render)


if __name__ == "__main__":
    main()
