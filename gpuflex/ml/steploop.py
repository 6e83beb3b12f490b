"""The local training loop every workload shares: effective batches as micro-batches with
gradient accumulation, mixed precision, out-of-memory back-off, and a step and time budget.

One optimizer step always covers the job's whole batch, however small the micro-batches, so
a member that backs off after an out-of-memory still takes the same steps on the same data.
The out-of-memory is caught where it happens: the step's gradients are dropped, the
micro-batch is halved, and the same batch is tried again. Only a batch of one that still
does not fit gives up (and then the round's training fails, not the node).

Under a time budget the loop stops before a step that would end past the budget, judged by
the last step's duration; the first step always runs, so a very slow member still counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from gpuflex.ml.fit import DeviceFit, free_memory, is_oom

#: (loss averaged over the micro-batch's samples, number of samples) of one micro-batch.
LossOf = Callable[[Any], tuple[torch.Tensor, int]]


@dataclass
class StepStats:
    loss_sum: float = 0.0  # mean loss of each step × its samples
    samples: int = 0
    steps: int = 0
    oom_retries: int = 0
    seconds: float = 0.0

    def metrics(self, fit: DeviceFit) -> dict[str, Any]:
        return {"train_loss": self.loss_sum / self.samples if self.samples else math.nan,
                "samples": self.samples, "steps": self.steps, "seconds": self.seconds,
                "samples_per_s": self.samples / self.seconds if self.seconds > 0 else 0.0,
                "micro_batch": fit.micro_batch, "accumulation": fit.accumulation,
                "oom_retries": self.oom_retries}


def split(batch: Any, size: int) -> list[Any]:
    """A batch (a tensor, or a tuple/list of tensors sharing the first dimension) in pieces."""
    if isinstance(batch, (tuple, list)):
        parts = [torch.split(t, size) for t in batch]
        return [type(batch)(p) if isinstance(batch, tuple) else list(p) for p in zip(*parts, strict=True)]
    return list(torch.split(batch, size))


def batch_len(batch: Any) -> int:
    return len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)


def run_steps(batches: Iterable[Any], fit: DeviceFit, optimizer: torch.optim.Optimizer, loss_of: LossOf, *,
              max_steps: int = 0, time_limit_s: float = 0.0, before_step: Callable[[], None] | None = None,
              clock: Callable[[], float] = time.perf_counter) -> StepStats:
    """Train over ``batches`` (each one optimizer step) until they run out, ``max_steps`` (if
    > 0) are done, or the next step would end past ``time_limit_s`` (if > 0).

    ``before_step`` runs between the backward passes and the optimizer step, on unscaled
    gradients (gradient clipping).
    """
    stats = StepStats()
    scaler = fit.scaler()
    device = torch.device(fit.device)
    began = clock()
    last = 0.0
    for batch in batches:
        if max_steps and stats.steps >= max_steps:
            break
        started = clock()
        if time_limit_s and stats.steps and (started - began) + last > time_limit_s:
            break
        total = batch_len(batch)
        while True:
            optimizer.zero_grad(set_to_none=True)
            try:
                loss_sum = 0.0
                for piece in split(batch, fit.micro_batch):
                    with fit.autocast():
                        loss, n = loss_of(piece)
                    scaled = loss * (n / total)  # mean over the whole batch, as one big pass
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                    loss_sum += float(loss.detach()) * n
                break
            except Exception as exc:
                if not is_oom(exc) or not fit.back_off():
                    raise
                stats.oom_retries += 1
                optimizer.zero_grad(set_to_none=True)
                free_memory(device)
        if scaler is not None:
            scaler.unscale_(optimizer)
        if before_step is not None:
            before_step()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        stats.loss_sum += loss_sum
        stats.samples += total
        stats.steps += 1
        last = clock() - started
    stats.seconds = clock() - began
    return stats
