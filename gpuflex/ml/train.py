"""Local training and evaluation with torch, on whatever device the machine has.

Members of one job can mix CPUs and GPUs: the weights that travel are float32 on the CPU, so
the device only matters inside a round. How the job is fitted to the device (precision,
micro-batch, threads) is ``gpuflex.ml.fit``'s choice; the loop itself is
``gpuflex.ml.steploop``. torch's thread pool is sized by the cores this process may use, or
by ``GPUFLEX_TORCH_THREADS`` (a local mesh of several processes on one machine sets 1, else
each process would start one thread per core and they would all contend).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpuflex.jobspec import JobSpec
from gpuflex.ml.fit import DeviceFit, Precision, choose_threads, forced_threads
from gpuflex.ml.steploop import run_steps
from gpuflex.plugins import PluginError, load_callable

_threads_lock = threading.Lock()
_threads_set = False


def configure_threads(device: torch.device | None = None) -> None:
    """Size torch's thread pool once per process (see ``gpuflex.ml.fit.choose_threads``)."""
    global _threads_set
    with _threads_lock:
        if not _threads_set:
            torch.set_num_threads(choose_threads((device or pick_device()).type, forced=forced_threads()))
            _threads_set = True


def pick_device() -> torch.device:
    """CUDA, then Apple MPS, then the CPU; ``GPUFLEX_DEVICE`` (e.g. ``cpu``, ``cuda:1``) wins."""
    forced = os.environ.get("GPUFLEX_DEVICE", "").strip()
    if forced:
        return torch.device(forced)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


#: The heavy-ball coefficient of ``optimizer = "momentum"``.
SGD_MOMENTUM = 0.9


def sgd_settings(spec: JobSpec) -> tuple[float, float] | None:
    """(lr, momentum) of the SGD that :func:`make_optimizer` builds for ``spec``; None for
    Adam and AdamW. SCAFFOLD reads its control variates off the SGD's steps with them
    (``gpuflex.ml.drift``)."""
    if spec.optimizer == "sgd":
        return spec.lr, 0.0
    if spec.optimizer == "momentum":
        return spec.lr, SGD_MOMENTUM
    return None


def make_optimizer(model: nn.Module, spec: JobSpec) -> torch.optim.Optimizer:
    """A fresh inner optimizer every round: its state is local and never averaged (FedAvg)."""
    params = model.parameters()
    sgd = sgd_settings(spec)
    if sgd is not None:
        lr, momentum = sgd
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=spec.weight_decay)
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer {spec.optimizer!r}")


def _batches(loader: DataLoader, spec: JobSpec, budgeted: bool = False) -> Iterator[Any]:
    """local_epochs full passes, or exactly local_steps batches cycling through the data; in
    a time-budgeted round, batches cycling until the step loop stops."""
    if spec.uses_steps or budgeted:
        done = 0
        while budgeted or done < spec.local_steps:
            for batch in loader:
                yield batch
                done += 1
                if done == spec.local_steps and not budgeted:
                    return
            if done == 0:  # an empty loader would otherwise spin forever
                return
    else:
        for _ in range(spec.local_epochs):
            yield from loader


def to_device(
    x: torch.Tensor, y: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move a batch; float64 features (numpy's default) become float32 like the weights."""
    if x.dtype == torch.float64:
        x = x.float()
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def plain_fit(device: torch.device, batch_size: int, precision: Precision = "fp32") -> DeviceFit:
    """Whole batches at ``precision``: the fit of a caller that did not probe the device."""
    return DeviceFit(device=str(device), name=device.type, capability=None, precision=precision,
                     batch_size=batch_size, micro_batch=batch_size, threads=torch.get_num_threads())


def local_train(
    model: nn.Module, loader: DataLoader, spec: JobSpec, device: torch.device, fit: DeviceFit | None = None,
    max_steps: int = 0, time_limit_s: float = 0.0, before_step: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Train in place; returns the mean loss, samples seen, optimizer steps taken, seconds.

    With ``time_limit_s`` (a time-budgeted round) it cycles through the data and stops at
    ``max_steps`` or the time limit, whichever comes first. ``before_step`` edits the
    gradients before each optimizer step (drift correction, ``gpuflex.ml.drift``).
    """
    configure_threads(device)
    model.to(device).train()
    optimizer = make_optimizer(model, spec)
    loss_fn = nn.CrossEntropyLoss()
    fit = fit or plain_fit(device, spec.batch_size)

    def loss_of(piece: Any) -> tuple[torch.Tensor, int]:
        x, y = to_device(piece[0], piece[1], device)
        return loss_fn(model(x), y), len(y)

    budgeted = time_limit_s > 0
    stats = run_steps(_batches(loader, spec, budgeted), fit, optimizer, loss_of,
                      max_steps=max_steps if budgeted else 0, time_limit_s=time_limit_s,
                      before_step=before_step)
    return stats.metrics(fit)


def run_train_fn(
    model: nn.Module, loader: DataLoader, spec: JobSpec, device: torch.device
) -> dict[str, Any]:
    """The user's own loop (``train_fn``) in place of :func:`local_train`.

    ``settings`` is the job as a plain dict plus ``device``; the returned metrics must be a
    dict, and numbers the node needs but the user left out are filled in.
    """
    configure_threads(device)
    fn = load_callable(spec.train_fn, "train_fn")
    model.to(device).train()
    settings = {**spec.to_dict(), "device": device}
    metrics = fn(model, loader, settings)
    if not isinstance(metrics, dict):
        raise PluginError(
            f"train_fn {spec.train_fn!r} returned {type(metrics).__name__}, expected a dict of metrics"
        )
    metrics = dict(metrics)
    metrics.setdefault("train_loss", math.nan)
    metrics.setdefault("samples", len(loader.dataset))  # type: ignore[arg-type]
    metrics.setdefault("steps", 0)
    return metrics


@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: Dataset, device: torch.device, batch_size: int = 512
) -> dict[str, float]:
    """Mean cross-entropy and accuracy over the whole dataset."""
    configure_threads()
    model.to(device).eval()
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    total_loss, correct, count = 0.0, 0, 0
    for x, y in DataLoader(dataset, batch_size=batch_size):
        x, y = to_device(x, y, device)
        logits = model(x)
        total_loss += float(loss_fn(logits, y))
        correct += int((logits.argmax(dim=1) == y).sum())
        count += len(y)
    if count == 0:
        return {"loss": math.nan, "accuracy": math.nan}
    return {"loss": total_loss / count, "accuracy": correct / count}
