"""How a job fits each device, and the out-of-memory back-off on real device memory.

For every device torch sees (the CPU, each CUDA device) it builds the job's workload there,
runs the member's probe (``gpuflex.ml.fit``: precision, the largest micro-batch that fits,
threads, throughput) and trains one time-budgeted round, so the settings and samples per
second of a GPU and the CPU are measured side by side in one run.

On CUDA it then checks the out-of-memory path with real allocations: a model seam reserves
device memory in proportion to the micro-batch, so the job's whole batch does not fit; the
probe must settle on a smaller micro-batch, and when another allocation later takes more of
the card mid-job, the round must back off again, take the same number of steps on the same
effective batch, and commit an update close to the one a roomy card computes.

This needs torch and the job's data only (no mesh), so it runs on a bare GPU machine:

    python -m benchmarks.device_fit [--budget-s 2] [--json]
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.common import add_json_flag, emit, format_table, log


def job(budget_s: float) -> Any:
    from gpuflex.jobspec import JobSpec, example_job_toml, tomllib

    spec = tomllib.loads(example_job_toml())
    spec.update(rounds=3, compute_budget_s=budget_s, partition="iid")
    return JobSpec.from_dict(spec)


def fit_row(device: str, budget_s: float) -> dict[str, Any]:
    import torch

    from gpuflex.ml.workload import Workload

    work = Workload(job(budget_s), 0, 3, device=torch.device(device))
    fit = work.fitted()
    _, metrics = work.train(work.initial_params(), max_steps=10**6, time_limit_s=budget_s)
    return {"device": device, "name": fit["name"], "capability": fit["capability"], "precision": fit["precision"],
            "micro_batch": fit["micro_batch"], "accumulation": fit["accumulation"], "threads": fit["threads"],
            "probe_samples_per_s": fit["samples_per_s"], "round_steps": metrics["steps"],
            "round_samples_per_s": metrics["samples_per_s"]}


def oom_check(budget_s: float) -> dict[str, Any]:
    """Real CUDA out-of-memory errors: at the probe, then mid-job."""
    import numpy as np
    import torch
    from torch import nn

    from gpuflex.ml.workload import Workload

    device = torch.device("cuda")
    free, _ = torch.cuda.mem_get_info(device)
    spec = job(budget_s)
    per_sample = int(free * 0.9 / spec.batch_size * 1.6)  # the whole batch needs 1.44 × free; half fits

    class Hungry(nn.Module):
        """Reserves ``per_sample`` bytes of device memory per sample during the forward pass."""

        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scratch = torch.empty(x.shape[0] * per_sample, dtype=torch.uint8, device=x.device)
            out = self.inner(x)
            del scratch
            return out

    roomy = Workload(spec, 0, 3, device=device)
    tight = Workload(spec, 0, 3, device=device, model_hook=Hungry)
    probed = tight.fitted()
    base = roomy.initial_params()
    ref, ref_metrics = roomy.train(base, max_steps=5, time_limit_s=600.0)
    torch.cuda.empty_cache()  # the probe's cached blocks go back, so the hog really takes the card
    hog = torch.empty(int(torch.cuda.mem_get_info(device)[0] * 0.35), dtype=torch.uint8, device=device)
    try:
        delta, metrics = tight.train(base, max_steps=5, time_limit_s=600.0)
    finally:
        del hog
        torch.cuda.empty_cache()
    return {"free_gib": free / 2**30, "probe_micro_batch": probed["micro_batch"],
            "round_micro_batch": metrics["micro_batch"], "accumulation": metrics["accumulation"],
            "oom_retries": metrics["oom_retries"], "steps": metrics["steps"], "ref_steps": ref_metrics["steps"],
            "samples": metrics["samples"], "ref_samples": ref_metrics["samples"],
            "max_abs_diff": float(np.max(np.abs(delta - ref))), "ref_max_abs": float(np.max(np.abs(ref)))}


def render(result: dict[str, Any]) -> str:
    cols = [("device", "device", ""), ("name", "name", ""), ("capability", "sm", ""), ("precision", "precision", ""),
            ("micro_batch", "micro", "d"), ("accumulation", "accum", "d"), ("threads", "threads", "d"),
            ("probe_samples_per_s", "probe smp/s", ".0f"), ("round_steps", "steps in budget", "d"),
            ("round_samples_per_s", "round smp/s", ".0f")]
    lines = [f"device fit: digits CNN, batch 32, {result['budget_s']:g} s budget", "",
             format_table(result["devices"], cols)]
    if result.get("oom"):
        o = result["oom"]
        lines += ["", f"CUDA out-of-memory: probe chose micro-batch {o['probe_micro_batch']}; with 35 % more of "
                      f"the card taken, the round retried {o['oom_retries']}x and trained {o['steps']} steps on "
                      f"micro-batches of {o['round_micro_batch']} (x{o['accumulation']}), {o['samples']} samples "
                      f"(roomy card: "
                      f"{o['ref_steps']} steps, {o['ref_samples']} samples); max |delta - roomy delta| "
                      f"{o['max_abs_diff']:.2e} (max |delta| {o['ref_max_abs']:.2e})"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=2.0)
    add_json_flag(parser)
    args = parser.parse_args()
    import torch

    devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    rows = []
    for name in devices:
        log(f"fitting on {name}")
        rows.append(fit_row(name, args.budget_s))
    oom = oom_check(args.budget_s) if torch.cuda.is_available() else None
    emit({"benchmark": "device_fit", "budget_s": args.budget_s, "torch": torch.__version__, "devices": rows,
          "oom": oom}, args.json, render)


if __name__ == "__main__":
    main()
