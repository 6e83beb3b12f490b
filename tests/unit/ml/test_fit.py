"""Fitting a job to the device: precision and threads by device, the micro-batch found with
real steps, out-of-memory back-off that keeps the effective batch, and the time budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gpuflex.jobspec import JobSpec
from gpuflex.ml.fit import choose_precision, choose_threads, find_micro_batch, is_oom
from gpuflex.ml.workload import Workload


@pytest.mark.parametrize(("device", "capability", "expected"), [
    ("cpu", None, "fp32"), ("mps", None, "fp32"), ("cuda", (5, 2), "fp32"),
    ("cuda", (6, 1), "fp32"),  # GTX 1080: no bf16, slow fp16
    ("cuda", (7, 0), "fp16"), ("cuda", (7, 5), "fp16"),
    ("cuda", (8, 0), "bf16"), ("cuda", (8, 6), "bf16"), ("cuda", (9, 0), "bf16"),
])
def test_precision_by_device(device: str, capability: tuple[int, int] | None, expected: str) -> None:
    assert choose_precision(device, capability) == expected


def test_threads_by_device() -> None:
    assert choose_threads("cpu", cores=6) == 1  # until the probe measures more cores faster
    assert choose_threads("cuda", cores=16) == 2
    assert choose_threads("cuda", cores=1) == 1
    assert choose_threads("cpu", cores=6, forced=3) == 3  # GPUFLEX_TORCH_THREADS


def test_the_largest_micro_batch_that_fits_is_found_by_halving() -> None:
    tried: list[int] = []

    def step(micro: int) -> None:
        tried.append(micro)
        if micro > 5:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    assert find_micro_batch(step, 32) == 4
    assert tried == [32, 16, 8, 4]
    with pytest.raises(torch.OutOfMemoryError):
        find_micro_batch(lambda m: step(m * 100), 32)  # not even one sample fits
    with pytest.raises(ValueError):  # only out-of-memory is backed off from
        find_micro_batch(lambda m: (_ for _ in ()).throw(ValueError("bug")), 32)
    assert is_oom(torch.cuda.OutOfMemoryError("x")) and not is_oom(RuntimeError("shape mismatch"))


class OutOfMemoryAbove(nn.Module):
    """A device seam: the model raises torch's real out-of-memory error on a micro-batch
    larger than ``limit``, as a small card would."""

    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner, self.limit, self.raised = inner, limit, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            self.raised += 1
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0]} samples")
        return self.inner(x)


@pytest.fixture
def mlp_spec(digits_spec: JobSpec) -> JobSpec:
    return JobSpec.from_dict({**digits_spec.to_dict(), "model": "mlp", "partition": "iid", "batch_size": 32,
                              "local_epochs": 1, "optimizer": "sgd"})


def test_a_small_device_trains_the_same_effective_batch(mlp_spec: JobSpec) -> None:
    seams: list[OutOfMemoryAbove] = []

    def hook(model: nn.Module) -> nn.Module:
        seams.append(OutOfMemoryAbove(model, limit=10))
        return seams[-1]

    big, small = Workload(mlp_spec, 0, 3), Workload(mlp_spec, 0, 3, model_hook=hook)
    fit = small.fitted()
    assert fit["micro_batch"] == 8 and fit["accumulation"] == 4 and fit["batch_size"] == 32
    assert fit["precision"] == "fp32" and fit["samples_per_s"] > 0
    base = big.initial_params()
    ref, ref_metrics = big.train(base)
    delta, metrics = small.train(base)
    assert metrics["steps"] == ref_metrics["steps"] and metrics["samples"] == ref_metrics["samples"]
    np.testing.assert_allclose(delta, ref, atol=2e-6)  # four micro-batches of 8 == one batch of 32


def test_out_of_memory_in_a_round_backs_off_and_keeps_the_effective_batch(mlp_spec: JobSpec) -> None:
    seams: list[OutOfMemoryAbove] = []

    def hook(model: nn.Module) -> nn.Module:
        seams.append(OutOfMemoryAbove(model, limit=1000))
        return seams[-1]

    ref_work, work = Workload(mlp_spec, 1, 3), Workload(mlp_spec, 1, 3, model_hook=hook)
    assert work.fitted()["micro_batch"] == 32  # the probe fits whole batches
    seams[0].limit = 12  # then another process takes most of the card's memory
    base = ref_work.initial_params()
    ref, _ = ref_work.train(base)
    delta, metrics = work.train(base)
    assert metrics["oom_retries"] == 2 and metrics["micro_batch"] == 8 and metrics["accumulation"] == 4
    np.testing.assert_allclose(delta, ref, atol=2e-6)
    assert work.fitted()["micro_batch"] == 8  # later rounds start from what fits


def test_a_time_budget_stops_training(mlp_spec: JobSpec) -> None:
    work = Workload(mlp_spec, 0, 3)
    base = work.initial_params()
    _, counted = work.train(base, max_steps=3, time_limit_s=60.0)
    assert counted["steps"] == 3 and counted["samples"] == 96
    _, timed = work.train(base, max_steps=10**6, time_limit_s=0.3)
    assert timed["steps"] > 3, "it cycles through the data until the budget ends"
    assert timed["seconds"] <= 0.3 + 0.25, "it stops at its budget (one step of slack on a busy machine)"
    _, one = work.train(base, max_steps=10**6, time_limit_s=1e-9)
    assert one["steps"] == 1, "the first step always runs: a slow member still counts"
