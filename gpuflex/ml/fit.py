"""Fitting a job to this device: precision, micro-batch size, CPU threads and throughput.

Members of one job run on anything from a CPU-only laptop to a data-centre GPU, and nobody
should hand-tune a batch size for an 8 GB card. Each member decides for its own device:

- **precision**: fp32 on the CPU and on Pascal (sm_6x: no bf16, and fp16 runs at a fraction of
  fp32 speed there), fp16 autocast with loss scaling on Volta and Turing (sm_70/75), bf16
  autocast on Ampere and later (sm_80+). Master weights and the update stay float32, so
  members on different precisions still average the same vector.
- **micro-batch**: the largest that fits, found with a real forward and backward pass at the
  job's batch size, halved on out-of-memory; gradient accumulation then keeps the job's
  effective batch size, so what a step means does not depend on the device.
- **threads**: one, or all the cores this process may really use (its affinity and cgroup
  quota) when the probe measures them clearly faster for this model; ``GPUFLEX_TORCH_THREADS``
  overrides (a local mesh of several processes on one machine sets 1).

The same probe times a few real steps, which gives the member's first throughput estimate
for time-budgeted rounds. ``gpuflex doctor --job`` prints the result per device.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from gpuflex.cpuquota import usable_cores

Precision = Literal["fp32", "fp16", "bf16"]
#: The probe times steps for at most this long (after one warm-up step), and at most PROBE_STEPS.
PROBE_S = 1.0
PROBE_STEPS = 3
#: Threads a GPU member gives torch's CPU pool: the GPU does the work, the CPU only feeds it.
GPU_HOST_THREADS = 2
#: A CPU member uses all its cores only if the probe measures them this much faster than one.
MORE_THREADS_GAIN = 1.3


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error from any backend (CUDA's is a subclass of torch's)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def choose_precision(device_type: str, capability: tuple[int, int] | None) -> Precision:
    """fp32 on CPU, MPS and Pascal or older; fp16 on sm_70/75; bf16 on sm_80 and up."""
    if device_type != "cuda" or capability is None:
        return "fp32"
    if capability >= (8, 0):
        return "bf16"
    if capability >= (7, 0):
        return "fp16"
    return "fp32"


def forced_threads() -> int | None:
    """``GPUFLEX_TORCH_THREADS``, if set to a number (a local mesh of processes sets 1)."""
    with contextlib.suppress(ValueError):
        return max(1, int(os.environ.get("GPUFLEX_TORCH_THREADS", "")))
    return None


def choose_threads(device_type: str, cores: int | None = None, forced: int | None = None) -> int:
    """torch's intra-op threads before any measurement: ``forced`` (the environment's) if
    set, else one on a CPU member (small models lose more to thread hand-offs than they gain,
    and a busy machine makes spinning threads far slower: the probe measures whether more
    cores pay off), and a couple on a GPU member, whose CPU only feeds the device."""
    if forced is not None:
        return forced
    cores = usable_cores() if cores is None else max(1, cores)
    return 1 if device_type == "cpu" else min(cores, GPU_HOST_THREADS)


def find_micro_batch(try_batch: Callable[[int], None], batch_size: int,
                     on_oom: Callable[[], None] = lambda: None) -> int:
    """The largest micro-batch (``batch_size``, halved on each out-of-memory) that
    ``try_batch`` runs without running out of memory; re-raises if even 1 does not fit."""
    micro = max(1, batch_size)
    while True:
        try:
            try_batch(micro)
            return micro
        except Exception as exc:
            if not is_oom(exc) or micro == 1:
                raise
            on_oom()
            micro = max(1, micro // 2)


def free_memory(device: torch.device) -> None:
    """Hand cached blocks back after an out-of-memory, so a smaller retry can fit."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class DeviceFit:
    """The settings one member trains a job with on one device."""

    device: str  # torch's name: "cpu", "cuda:0"
    name: str  # what it is: "CPU ×2", "NVIDIA GeForce GTX 1080"
    capability: str | None
    precision: Precision
    batch_size: int  # the job's effective batch
    micro_batch: int
    threads: int
    samples_per_s: float = 0.0

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step."""
        return math.ceil(self.batch_size / self.micro_batch)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(torch.device(self.device).type, dtype=dtype)

    def scaler(self) -> Any:
        """fp16 needs loss scaling (its range is small); bf16 and fp32 do not."""
        if self.precision != "fp16":
            return None
        return torch.amp.GradScaler(torch.device(self.device).type)

    def back_off(self) -> bool:
        """Halve the micro-batch after an out-of-memory; False when it is already 1."""
        if self.micro_batch <= 1:
            return False
        self.micro_batch = max(1, self.micro_batch // 2)
        return True

    @property
    def summary(self) -> str:
        accum = f" × {self.accumulation} accumulated" if self.accumulation > 1 else ""
        return (f"{self.name} ({self.device}), {self.precision}, micro-batch {self.micro_batch}{accum} "
                f"= batch {self.batch_size}, {self.threads} thread(s), {self.samples_per_s:.0f} samples/s")

    def describe(self) -> dict[str, Any]:
        """JSON-able, with ``device`` the short text a member puts in its updates."""
        out = asdict(self)
        out.update(device=f"{self.name} {self.precision}", torch_device=self.device,
                   accumulation=self.accumulation, summary=self.summary)
        return out


def describe_device(device: torch.device) -> tuple[str, str | None]:
    """(name, compute capability) of ``device``."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return str(props.name), f"{props.major}.{props.minor}"
    if device.type == "mps":
        return "Apple GPU", None
    return f"CPU ×{usable_cores()}", None


def fit_device(device: torch.device, batch_size: int, step: Callable[[int, DeviceFit], None],
               *, precision: Precision | None = None, clock: Callable[[], float] = time.perf_counter) -> DeviceFit:
    """Choose precision and threads, find the micro-batch with real steps, time the throughput.

    ``step(micro, fit)`` runs one forward and backward pass over a micro-batch of ``micro``
    samples under ``fit``'s autocast (no optimizer step, gradients are discarded).
    """
    name, cap = describe_device(device)
    capability = tuple(int(x) for x in cap.split(".")) if cap else None
    fit = DeviceFit(device=str(device), name=name, capability=cap,
                    precision=precision or choose_precision(device.type, capability),  # type: ignore[arg-type]
                    batch_size=batch_size, micro_batch=batch_size,
                    threads=choose_threads(device.type, forced=forced_threads()))
    torch.set_num_threads(fit.threads)
    fit.micro_batch = find_micro_batch(lambda m: step(m, fit), batch_size, lambda: free_memory(device))
    fit.samples_per_s = _throughput(step, fit, device, clock)
    cores = usable_cores()
    if device.type == "cpu" and cores > 1 and forced_threads() is None:
        one = fit.samples_per_s
        torch.set_num_threads(cores)
        step(fit.micro_batch, fit)  # warm the larger pool up
        many = _throughput(step, fit, device, clock)
        if many > MORE_THREADS_GAIN * one:
            fit.threads, fit.samples_per_s = cores, many
        else:
            torch.set_num_threads(fit.threads)
    return fit


def _throughput(step: Callable[[int, DeviceFit], None], fit: DeviceFit, device: torch.device,
                clock: Callable[[], float]) -> float:
    """Samples per second over a few real effective batches (bounded by PROBE_S)."""
    timed, samples, began = 0, 0, clock()
    while timed < PROBE_STEPS and clock() - began < PROBE_S:
        for size in _chunks(fit.batch_size, fit.micro_batch):
            step(size, fit)
            samples += size
        timed += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    took = clock() - began
    return samples / took if took > 0 else 0.0


def _chunks(total: int, size: int) -> Iterator[int]:
    while total > 0:
        yield min(size, total)
        total -= size
