"""``gpuflex doctor --job FILE``: how this machine would run that job, per device.

A member fits every job to its own device when it joins (``gpuflex.ml.fit``): precision by
compute capability, the largest micro-batch that fits (found with real steps, gradient
accumulation keeping the job's batch), CPU threads, and its throughput, which sets its steps
in a time-budgeted round. The doctor runs the same probe on the CPU and on every GPU torch
sees, so an operator knows before joining what each device would do, and a device that
cannot fit the job at all (not even a micro-batch of one) is a FAIL with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuflex.doctor.findings import FAIL, OK, WARN, Finding


def devices(torch: Any) -> list[str]:
    """The CPU, every CUDA device, and Apple's GPU where torch has it."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


def budget_note(fit: dict[str, Any], budget_s: float, batch_size: int) -> str:
    """Steps this device would take in a round of ``budget_s`` seconds at its measured throughput
    (a plan allows more, ``workplan.STEP_HEADROOM``; the time stop ends training at the budget)."""
    rate = float(fit.get("samples_per_s") or 0.0)
    if budget_s <= 0 or rate <= 0:
        return ""
    steps = max(1, int(budget_s * rate / max(1, batch_size)))
    return f"; about {steps} local steps in the job's {budget_s:g} s budget"


def check_job_fit(job_file: Path, home: str | os.PathLike[str] | None = None) -> Iterator[Finding]:
    """One finding per device: the settings a member would train ``job_file``'s job with."""
    from gpuflex.home import resolve_home
    from gpuflex.jobspec import JobSpec, JobSpecError

    try:
        spec = JobSpec.from_file(Path(job_file))
    except JobSpecError as exc:  # every field's error, as ``job submit`` lists them
        yield Finding("job-fit", FAIL, f"{job_file} is not a valid job ({len(exc.errors)} error(s))",
                      fix="fix the job file", data={"errors": [f"{n}: {m}" for n, m in exc.errors]})
        for name, message in exc.errors:
            yield Finding("job-fit", FAIL, f"  {name}: {message}")
        return
    except (OSError, ValueError) as exc:
        yield Finding("job-fit", FAIL, f"{job_file}: {exc}".splitlines()[0], fix="fix the job file")
        return
    if spec.train_fn:
        yield Finding("job-fit", WARN, f"{spec.name}: a train_fn plug-in runs its own loop; "
                      "precision and micro-batch are its choice, not the node's")
        return
    import torch

    from gpuflex.ml.workload import WorkloadUnavailable, open_workload, pin_job_spec

    root = resolve_home(home)
    try:
        # A language-model job is pinned (base and tokenizer hashes) by the node it is submitted
        # through; the doctor pins it the same way from this home, so it fits what would run.
        spec = pin_job_spec(spec, root)
    except WorkloadUnavailable as exc:
        yield Finding("job-fit", FAIL, f"{spec.name} cannot run here: {str(exc)[:300]}",
                      fix="name the job's data and models in this home's node.toml (see the job file's comments)")
        return
    for name in devices(torch):
        check = f"fit {name}"
        try:
            fit = open_workload(spec, 0, 1, root, device=torch.device(name)).fitted()
        except Exception as exc:  # an out-of-memory at a micro-batch of 1, missing data, ...
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            yield Finding(check, FAIL, f"{spec.name} cannot run here: {reason[:300]}",
                          fix="a smaller model or seq_len, or leave this device out of the job")
            continue
        data = {k: v for k, v in fit.items() if isinstance(v, (int, float, str)) or v is None}
        yield Finding(check, OK, f"{fit['summary']}{budget_note(fit, spec.compute_budget_s, spec.batch_size)}",
                      data=data)
