"""Fitting a served model to this node's device, as training fits a job (``gpuflex.ml.fit``).

An operator writes one ``[serve]`` section for a laptop and for a data-centre GPU alike, so the
node, not the operator, decides what its device holds:

- **device**: the one training would use (``gpuflex.ml.train.pick_device``: CUDA, then Apple's
  MPS, then the CPU; ``GPUFLEX_DEVICE`` wins).
- **dtype**: the precision training would use there (``gpuflex.ml.fit.choose_precision``):
  bf16 on Ampere and later, fp16 on Volta and Turing, float32 on the CPU, MPS and older cards.
  Serving has no gradients to keep in float32, so the weights themselves are cast.
- **KV-cache budget**: ``memory_mb``, but never more than ``KV_FRACTION`` of the memory the
  device has free once the model is loaded (less what this node's other served models have
  already claimed there): an operator's 4 GB on an 8 GB card that already holds a 6 GB model
  would otherwise run out of memory mid-request.
- **batch**: ``max_batch``, halved while a probe runs out of memory (``find_micro_batch``, as
  training finds its micro-batch). The probe is real: a prefill of the whole batch, the cache
  widened to the widest reservation the budget lets that many rows have (a prompt of
  ``max_prompt_tokens`` plus ``max_new_tokens``), and a decode step over it. On the CPU, where
  running out of memory is the kernel's business rather than an exception, the prompts are one
  token long: the probe then costs two forward passes of ``max_batch`` tokens (well under a
  second for the models a CPU serves) and confirms the batch the budget already bounds.

The fitted figures are in the service's status rows and the announced capacity is the fitted
batch, so routers weigh a node by what it really holds. No peer input reaches any of this.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpuflex.ml.fit import choose_precision, describe_device, find_micro_batch, free_memory, is_oom
from gpuflex.serve import ServeError
from gpuflex.serve.engine import BatchEngine, max_positions

log = logging.getLogger("gpuflex.serve")
#: The share of the device's free memory (after loading) the KV cache may take: the rest is
#: for activations, the allocator's fragmentation and whatever else the node runs there.
KV_FRACTION = 0.8
#: The prompt length of the CPU probe (see the module's docstring).
CPU_PROBE_PROMPT = 1
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MB = 1 << 20


@dataclass(frozen=True)
class ServeFit:
    """How one served model runs on this node's device."""

    device: str  # torch's name: "cpu", "cuda:0"
    device_name: str  # what it is: "CPU ×2", "NVIDIA H100"
    dtype: str  # "float32", "bfloat16", "float16"
    max_batch: int  # sequences decoded together, as fitted
    asked_batch: int  # the operator's max_batch
    memory_bytes: int  # the KV-cache budget, as fitted
    asked_bytes: int  # the operator's memory_mb
    free_bytes: int | None  # the device's free memory after loading (None: unknown)
    probe_ms: float

    def row(self) -> dict[str, Any]:
        """The ``fit`` of a model's status row (``gpuflex status --json``)."""
        return {"device": self.device, "device_name": self.device_name, "dtype": self.dtype,
                "batch": self.max_batch, "asked_batch": self.asked_batch,
                "memory_mb": round(self.memory_bytes / MB, 1), "asked_memory_mb": round(self.asked_bytes / MB, 1),
                "free_mb": None if self.free_bytes is None else round(self.free_bytes / MB, 1),
                "probe_ms": round(self.probe_ms, 1)}


def serving_dtype(device: torch.device) -> torch.dtype:
    """The dtype training's precision choice gives ``device`` (float32 off CUDA)."""
    _, cap = describe_device(device)
    capability = tuple(int(x) for x in cap.split(".")) if cap else None
    return DTYPES[choose_precision(device.type, capability)]  # type: ignore[arg-type]


def _available_ram() -> int | None:
    """Memory a new allocation may take: the kernel's ``MemAvailable``, and no more than the
    cgroup (v2) still allows this process, in a container with a memory limit. Linux only."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            found.append(max(0, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def device_free_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` now: CUDA's own count after handing cached blocks back,
    MPS's recommended ceiling less what its driver holds, the CPU's available RAM."""
    if device.type == "cuda":
        torch.cuda.empty_cache()  # blocks torch caches count as used in cudaMemGetInfo
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "mps":
        try:
            return max(0, int(torch.mps.recommended_max_memory()) - int(torch.mps.driver_allocated_memory()))
        except (AttributeError, RuntimeError):
            return None
    return _available_ram()


def kv_budget(asked: int, free: int | None, claimed: int = 0) -> int:
    """The KV-cache budget: ``asked`` (the operator's), at most ``KV_FRACTION`` of what is free
    less what other served models on the device have ``claimed``."""
    if free is None:
        return asked
    return max(0, min(asked, int(max(0, free - claimed) * KV_FRACTION)))


def probe_width(rows: int, widest: int, budget: int, per_token: int) -> int:
    """Cache positions ``rows`` sequences can have at once: the widest reservation, or what
    the budget leaves each when that many share it (the scheduler admits no more)."""
    return min(widest, budget // max(1, rows * per_token))


def fit_batch(run: Callable[[int, int], None], max_batch: int, widest: int, budget: int, per_token: int,
              on_oom: Callable[[], None] = lambda: None) -> int:
    """The largest batch, ``max_batch`` halved on each out-of-memory, for which
    ``run(rows, width)`` (a probe of ``rows`` sequences over ``width`` cache positions) works.
    The batch is first cut to what the budget holds at two positions a row; 0 when not even
    one sequence of two tokens fits the budget. Re-raises if even one row runs out of memory."""
    cap = min(max_batch, budget // max(1, 2 * per_token))
    if cap < 1:
        return 0
    return find_micro_batch(lambda rows: run(rows, probe_width(rows, widest, budget, per_token)), cap, on_oom)


def fit_model(model: Any, eos_id: int | None, *, max_batch: int, memory_bytes: int, max_prompt_tokens: int,
              max_new_tokens: int, claimed: int = 0, device: torch.device | None = None,
              clock: Callable[[], float] = time.perf_counter) -> tuple[Any, ServeFit]:
    """Put ``model`` on this node's device in its dtype and fit the batch and budget to it
    (blocking: run it on a worker thread). Returns the placed model and its fit."""
    from gpuflex.ml.train import pick_device

    device = device or pick_device()
    dtype = serving_dtype(device)
    name, _ = describe_device(device)
    try:
        model = model.to(device=device, dtype=dtype)
    except Exception as exc:
        if not is_oom(exc):
            raise
        free_memory(device)
        raise ServeError(f"the model does not fit in {device}'s memory ({dtype}): {str(exc).splitlines()[0]}") from None
    free = device_free_bytes(device)
    budget = kv_budget(memory_bytes, free, claimed)
    engine = BatchEngine(model, eos_id)
    per_token = engine.per_token  # at the dtype the weights were just cast to
    widest = min(max_prompt_tokens + max_new_tokens, max_positions(model.config))
    short = device.type == "cpu"

    def run(rows: int, width: int) -> None:
        prompt = CPU_PROBE_PROMPT if short else min(max_prompt_tokens, width - 1)
        engine.probe(rows, max(1, min(prompt, width - 1)), width)

    began = clock()
    try:
        batch = fit_batch(run, max_batch, widest, budget, per_token, lambda: free_memory(device))
    except Exception as exc:
        if not is_oom(exc):
            raise
        free_memory(device)
        raise ServeError(f"not even one sequence at the widest reservation ({widest} tokens) fits in "
                         f"{device}'s memory beside the model; lower max_prompt_tokens or max_new_tokens") from None
    if batch < 1:
        raise ServeError(f"{device} has {budget >> 10} KiB for the KV cache after loading the model "
                         f"(memory_mb {memory_bytes >> 20}, free {(free or 0) >> 20} MiB): too little to serve")
    fit = ServeFit(str(device), name, str(dtype).removeprefix("torch."), batch, max_batch, budget, memory_bytes,
                   free, (clock() - began) * 1000)
    if batch < max_batch or budget < memory_bytes:
        log.warning("fitted to %s: batch %d of max_batch %d, KV cache %d MiB of memory_mb %d",
                    device, batch, max_batch, budget >> 20, memory_bytes >> 20)
    return model, fit
