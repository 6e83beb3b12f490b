"""The node's one handle on torch: flat float32 vectors in, flat float32 vectors out.

The node runtime deals in hashes, blobs and signatures; it should not know about modules,
loaders or devices. A :class:`Workload` hides them behind ``initial_params``, ``train`` and
``evaluate``. It is safe to call from a worker thread (a lock serialises use of its model),
and data bundles are cached per process, so several in-process nodes (the SDK's quick local
mesh, the tests) load a data set once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from aggregation.scaffold import control_of
from gpuflex.errors import GpuflexError
from gpuflex.jobspec import JobSpec
from gpuflex.ml.datasets import DataBundle, load_data
from gpuflex.ml.drift import DriftCorrection
from gpuflex.ml.fit import DeviceFit, fit_device
from gpuflex.ml.models import build_model
from gpuflex.ml.params import flatten_params, load_flat_params, state_dict_from_flat
from gpuflex.ml.partition import partition_indices
from gpuflex.ml.train import (
    configure_threads,
    evaluate,
    local_train,
    make_optimizer,
    pick_device,
    run_train_fn,
    to_device,
)
from gpuflex.nodeconfig import NodeConfig, load_node_config
from gpuflex.plugins import PluginError, load_callable

_cache_lock = threading.Lock()
_bundles: dict[tuple[Any, ...], DataBundle] = {}


def load_bundle(spec: JobSpec, data_path: str) -> DataBundle:
    """Load once per process per (data, path, split); the split depends on nothing else."""
    key = (spec.data, data_path, spec.seed, spec.test_fraction)
    with _cache_lock:
        if key not in _bundles:
            _bundles[key] = load_data(spec, data_path)
        return _bundles[key]


def resolve_data_path(spec: JobSpec, config: NodeConfig) -> str:
    """Where this node reads the job's data set: its operator's ``[data]`` entry of that name
    (node.toml or ``--data NAME=PATH``), never a path from the job; "" when none is set (the
    sklearn sets need none, and a data plug-in gets "")."""
    path = config.data_path(spec.data)
    return "" if path is None else str(path)


def split_for(
    spec: JobSpec, bundle: DataBundle, part_index: int, num_parts: int
) -> np.ndarray:
    """This part's training indices, by the built-in schemes or the partitioner plug-in."""
    labels = np.asarray(bundle.train_labels)
    if spec.partitioner:
        fn = load_callable(spec.partitioner, "partitioner")
        parts = fn(
            labels, num_parts, spec.partition, alpha=spec.alpha,
            shards_per_node=spec.shards_per_node, seed=spec.seed, groups=bundle.groups,
        )
        if not isinstance(parts, (list, tuple)) or len(parts) != num_parts:
            raise PluginError(
                f"partitioner {spec.partitioner!r} returned {type(parts).__name__}, "
                f"expected a list of {num_parts} index arrays"
            )
    else:
        parts = partition_indices(
            labels, num_parts, spec.partition, alpha=spec.alpha,
            shards_per_node=spec.shards_per_node, seed=spec.seed, groups=bundle.groups,
            min_size=spec.batch_size,
        )
    return np.asarray(parts[part_index], dtype=np.int64)


class Workload:
    """One node's share of a job: its data part, its model, and training on demand."""

    def __init__(
        self,
        spec: JobSpec,
        part_index: int,
        num_parts: int,
        home: Path | None = None,
        device: torch.device | None = None,
        data_hook: Callable[[Dataset, int], Dataset] | None = None,
        config: NodeConfig | None = None,
        model_hook: Callable[[nn.Module], nn.Module] | None = None,
    ):
        """``config``: the node's configuration for this run (node.toml with its start flags);
        read from ``home`` when not given."""
        self.spec = spec
        # Test meshes only: the label-flip adversary wraps the training set (gpuflex/adversary.py),
        # and a test's device seam wraps the model (an out-of-memory on large micro-batches).
        self.data_hook = data_hook
        self.device = device or pick_device()
        self._lock = threading.Lock()
        self._bundle = load_bundle(spec, resolve_data_path(spec, config or load_node_config(home)))
        self._model = build_model(spec, self._bundle)
        if model_hook is not None:
            self._model = model_hook(self._model)
        self._fit: DeviceFit | None = None
        self._initial = flatten_params(self._model)
        self._model.to(self.device)
        # The first optimizer in a process imports torch._dynamo (about 2 s of CPU); pay it
        # here, at join time, rather than inside round 1's training deadline.
        make_optimizer(self._model, spec)
        self._trained_rounds = 0
        self._drift = DriftCorrection.for_job(spec)
        self.set_part(part_index, num_parts)

    def set_part(self, part_index: int, num_parts: int) -> None:
        """Re-split when membership changes between rounds; cheap, the data stays cached."""
        if not 0 <= part_index < num_parts:
            raise ValueError(f"part_index must be in [0, {num_parts}), got {part_index}")
        indices = split_for(self.spec, self._bundle, part_index, num_parts)
        with self._lock:
            self.part_index, self.num_parts = part_index, num_parts
            self._indices = indices
            train: Dataset = Subset(self._bundle.train, indices.tolist())
            self._train = self.data_hook(train, self._bundle.num_classes) if self.data_hook else train

    @property
    def bundle(self) -> DataBundle:
        return self._bundle

    @property
    def indices(self) -> np.ndarray:
        """This node's rows of the shared training split (read-only by convention)."""
        return self._indices

    @property
    def num_samples(self) -> int:
        return len(self._indices)

    @property
    def num_params(self) -> int:
        return int(self._initial.shape[0])

    def initial_params(self) -> np.ndarray:
        """Round 0's model, identical on every node because it depends only on the seed."""
        return self._initial.copy()

    def _loader(self) -> DataLoader:
        # The shuffle order depends on (seed, part, round) so a rerun reproduces it exactly.
        gen = torch.Generator().manual_seed(
            (self.spec.seed * 1_000_003 + self.part_index * 7919 + self._trained_rounds) % 2**63
        )
        return DataLoader(self._train, batch_size=self.spec.batch_size, shuffle=True, generator=gen)

    def _fitted(self) -> DeviceFit:
        """This device's settings for the job, probed with real steps on a real batch once.
        The probe only leaves gradients behind, which every training step clears."""
        if self._fit is None:
            configure_threads(self.device)
            batch = next(iter(self._loader()))
            x_all, y_all = batch[0], batch[1]
            loss_fn = torch.nn.CrossEntropyLoss()
            self._model.to(self.device).train()

            def step(micro: int, fit: DeviceFit) -> None:
                x, y = to_device(x_all[:micro], y_all[:micro], self.device)
                with fit.autocast():
                    loss = loss_fn(self._model(x), y)
                loss.backward()
                self._model.zero_grad(set_to_none=True)

            self._fit = fit_device(self.device, self.spec.batch_size, step)
        return self._fit

    def fitted(self) -> dict[str, Any]:
        """How the job fits this device (``gpuflex.ml.fit``): precision, micro-batch, threads,
        and the throughput of the probe's real steps."""
        with self._lock:
            return self._fitted().describe()

    def train(self, base: np.ndarray, max_steps: int = 0, time_limit_s: float = 0.0,
              server_state: Mapping[str, np.ndarray] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Train from ``base``; returns (trained − base as float32, metrics). Under a time
        budget, at most ``max_steps`` steps and ``time_limit_s`` seconds.

        With SCAFFOLD the returned vector is twice the model's length: the model delta, then
        this member's control-variate delta; ``server_state`` is the state that came with
        ``base`` (it holds the mesh's control variate)."""
        base = np.asarray(base, dtype=np.float32)
        with self._lock:
            load_flat_params(self._model, base)
            start = time.perf_counter()
            if self.spec.train_fn:
                metrics = run_train_fn(self._model, self._loader(), self.spec, self.device)
            else:
                hook = None
                if self._drift is not None:
                    control = control_of(dict(server_state or {}), base.size) if self._drift.sends_control else None
                    hook = self._drift.hook(self._model, control)
                metrics = local_train(self._model, self._loader(), self.spec, self.device, self._fitted(),
                                      max_steps=max_steps, time_limit_s=time_limit_s, before_step=hook)
            seconds = time.perf_counter() - start
            self._trained_rounds += 1
            delta = flatten_params(self._model) - base
            if self._drift is not None:
                self._drift.observe_delta(delta)
            if self._drift is not None and self._drift.sends_control:
                delta = np.concatenate([delta, self._drift.control_delta()])
        metrics["seconds"] = seconds
        metrics["samples_per_s"] = metrics["samples"] / seconds if seconds > 0 else 0.0
        metrics["dataset_size"] = self.num_samples
        if self._fit is not None:
            self._fit.samples_per_s = metrics["samples_per_s"] or self._fit.samples_per_s
        return delta.astype(np.float32, copy=False), metrics

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """Loss and accuracy on the shared held-out test split."""
        with self._lock:
            load_flat_params(self._model, np.asarray(params, dtype=np.float32))
            return evaluate(self._model, self._bundle.test, self.device)

    def state_dict(self, params: np.ndarray) -> dict[str, torch.Tensor]:
        return state_dict_from_flat(self._model, params)

    def export_model(self, params: np.ndarray, out: Path) -> list[Path]:
        """The final model for people and tools: ``model.pt``, a plain torch state_dict."""
        return [self.save_state_dict(params, Path(out) / "model.pt")]

    def save_state_dict(self, params: np.ndarray, path: str | os.PathLike[str]) -> Path:
        """Write a CPU state_dict that plain ``torch.load`` reads; atomic via rename."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.state_dict(params), tmp)
        os.replace(tmp, path)
        return path


class WorkloadUnavailable(GpuflexError, RuntimeError):
    """This node cannot run (or pin) the job; the message says why in one line."""


def pin_job_spec(spec: JobSpec, home: Path | None, config: NodeConfig | None = None) -> JobSpec:
    """``spec`` with the hashes of what every member must hold alike filled in, as this
    (submitting) node holds them; unchanged for jobs that have none."""
    from gpuflex.llmspec import is_llm

    if not is_llm(spec.model):
        return spec
    from gpuflex.ml.llm import LLMError
    from gpuflex.ml.llm.pin import pin_llm_spec

    try:
        return pin_llm_spec(spec, home, config)
    except LLMError as exc:
        raise WorkloadUnavailable(str(exc)) from None


class NodeWorkload(Protocol):
    """What the node asks of a workload: flat float32 vectors in and out, and an export."""

    @property
    def num_samples(self) -> int: ...

    def initial_params(self) -> np.ndarray: ...

    def train(self, base: np.ndarray, max_steps: int = 0, time_limit_s: float = 0.0,
              server_state: Mapping[str, np.ndarray] | None = None) -> tuple[np.ndarray, dict[str, Any]]: ...

    def fitted(self) -> dict[str, Any]: ...

    def evaluate(self, params: np.ndarray) -> dict[str, float]: ...

    def export_model(self, params: np.ndarray, out: Path) -> list[Path]: ...


def open_workload(spec: JobSpec, *args: Any, **kwargs: Any) -> NodeWorkload:
    """The workload for ``spec`` (arguments as :class:`Workload`'s): a language model's
    (gpuflex.ml.llm) or the classic one. Both offer the same flat-vector surface, so the node
    never needs to know which it runs."""
    from gpuflex.llmspec import is_llm

    if is_llm(spec.model):
        from gpuflex.ml.llm.workload import LLMWorkload

        return LLMWorkload(spec, *args, **kwargs)
    return Workload(spec, *args, **kwargs)
