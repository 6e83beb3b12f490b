"""One node's share of a language-model job, behind the node's flat-vector interface.

The vector the mesh hashes, encodes, averages and commits holds only the trainable tensors:
with ``adapter = "lora"`` that is the LoRA A and B matrices (well under 1 % of a 100M model),
so the base never travels and every codec, server optimizer and ledger rule works on
adapters unchanged. With ``adapter = "none"`` it is every weight (a full fine-tune).

Memory: the model lives once, on the training device. Trained weights are written straight
into one preallocated delta buffer (no concatenated copy, no second vector for the
difference), and a full model's initial vector is handed to the node once and then dropped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gpuflex.jobspec import JobSpec
from gpuflex.ml.fit import DeviceFit, choose_precision, fit_device
from gpuflex.ml.llm import LLMError, require_extra
from gpuflex.ml.llm.models import base_hash, build_base, trainable, with_adapter
from gpuflex.ml.llm.text import TextBundle, documents, load_text
from gpuflex.ml.llm.tokenizer import eos_id, make_tokenizer, tokenizer_hash
from gpuflex.ml.params import as_tensor
from gpuflex.ml.partition import partition_indices
from gpuflex.ml.steploop import run_steps
from gpuflex.ml.train import configure_threads, make_optimizer, pick_device, plain_fit
from gpuflex.nodeconfig import NodeConfig, NodeConfigError, load_node_config

log = logging.getLogger("gpuflex.llm")
#: Above this many trainable values the optimizer steps tensor by tensor (less memory).
FOREACH_MAX_PARAMS = 10_000_000


def return_freed_memory() -> None:
    """Have glibc hand every freed block of 1 MiB or more back to the system at once.

    Training and the round's vector work allocate and free many temporaries of a few MB;
    glibc otherwise raises its mmap threshold after the first frees and keeps later ones in
    its heap, which measured 0.4 GB of resident memory per node at 100M parameters.
    """
    import contextlib
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD


def job_tokenizer(spec: JobSpec, config: NodeConfig) -> Any:
    """The job's tokenizer on this node (BPE is trained on the job's shared text)."""
    s = spec.llm
    if s["tokenizer"] == "model":
        try:
            model_dir = config.model_dir(s["pretrained"])
        except NodeConfigError as exc:
            raise LLMError(str(exc)) from None
        return make_tokenizer("model", s["vocab_size"], model_dir=model_dir)
    texts = documents(spec, config).values() if s["tokenizer"] == "bpe" else None
    return make_tokenizer(s["tokenizer"], s["vocab_size"], texts=texts)


def check_pinned(what: str, expected: str, actual: str, hint: str) -> None:
    """Refuse to join when this node's input differs from the one the job was made with."""
    if not expected:
        raise LLMError(f"refusing to join: the job carries no {what} hash (jobs are pinned when submitted)")
    if expected != actual:
        raise LLMError(f"refusing to join: this node's {what} hashes to {actual[:16]}…, the job's to "
                       f"{expected[:16]}…; {hint}")


class LLMWorkload:
    """Same surface as :class:`gpuflex.ml.workload.Workload`: flat float32 vectors in and out."""

    def __init__(self, spec: JobSpec, part_index: int, num_parts: int, home: Path | None = None,
                 device: torch.device | None = None, data_hook: Callable[[Dataset, int], Dataset] | None = None,
                 config: NodeConfig | None = None, *, verify: bool = True):
        require_extra()
        return_freed_memory()
        if data_hook is not None:
            log.warning("the label-flip data hook does not apply to language models; ignored")
        self.spec = spec
        self.settings = spec.llm
        self.device = device or pick_device()
        self._lock = threading.Lock()
        try:
            self.config = config or load_node_config(home)
        except NodeConfigError as exc:
            raise LLMError(str(exc)) from None
        self.tokenizer = job_tokenizer(spec, self.config)
        self.tokenizer_hash = tokenizer_hash(self.tokenizer)
        if verify:
            check_pinned("tokenizer", self.settings["tokenizer_hash"], self.tokenizer_hash,
                         "every member must tokenise alike (same text, same tokenizer settings)")
        self.text: TextBundle = load_text(spec, self.config, self.tokenizer, self.tokenizer_hash)
        base = build_base(spec, self.config, self.tokenizer.get_vocab_size(), eos_id(self.tokenizer))
        self.base_hash = base_hash(base)
        if verify:
            check_pinned("base model", self.settings["base_hash"], self.base_hash,
                         "every member must hold the same base weights")
        self.model = with_adapter(base, spec)
        self._params = [p for _, p in trainable(self.model)]
        self._initial: np.ndarray | None = self._flatten()
        self.model.to(self.device)
        self._trained_rounds = 0
        self._fit: DeviceFit | None = None
        self.set_part(part_index, num_parts)

    # -- the vector ----------------------------------------------------------------------

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self._params)

    @property
    def trainable_names(self) -> list[str]:
        return [n for n, _ in trainable(self.model)]

    def _flatten(self, out: np.ndarray | None = None) -> np.ndarray:
        """The trainable tensors, written into ``out`` (or a new vector) without a concat copy."""
        out = np.empty(self.num_params, dtype=np.float32) if out is None else out
        offset = 0
        for p in self._params:
            n = p.numel()
            out[offset:offset + n] = p.detach().reshape(-1).to("cpu", torch.float32).numpy()
            offset += n
        return out

    def _load(self, vec: np.ndarray) -> None:
        vec = np.asarray(vec)
        if vec.ndim != 1 or vec.shape[0] != self.num_params:
            raise ValueError(f"parameter vector has shape {vec.shape}, expected ({self.num_params},)")
        flat = as_tensor(vec)
        offset = 0
        with torch.no_grad():
            for p in self._params:
                n = p.numel()
                p.copy_(flat[offset:offset + n].view(p.shape))
                offset += n

    def initial_params(self) -> np.ndarray:
        """Round 0's trainable tensors (the fresh adapter, or the whole base), the same on
        every node. A full model's vector is handed over once and not kept."""
        with self._lock:
            if self._initial is None:  # asked again: rebuild rather than hold a copy all job long
                fresh = with_adapter(build_base(self.spec, self.config, self.tokenizer.get_vocab_size(),
                                                eos_id(self.tokenizer)), self.spec)
                return np.concatenate([p.detach().reshape(-1).numpy() for _, p in trainable(fresh)])
            init = self._initial
            if self.settings["adapter"] == "none":
                self._initial = None
                return init
            return init.copy()

    # -- data ----------------------------------------------------------------------------

    def set_part(self, part_index: int, num_parts: int) -> None:
        if not 0 <= part_index < num_parts:
            raise ValueError(f"part_index must be in [0, {num_parts}), got {part_index}")
        parts = partition_indices(self.text.train_labels, num_parts, self.spec.partition, seed=self.spec.seed,
                                  groups=self.text.groups)
        with self._lock:
            self.part_index, self.num_parts = part_index, num_parts
            self._indices = np.asarray(parts[part_index], dtype=np.int64)
            self._train = TensorDataset(self.text.train[torch.from_numpy(self._indices)])

    @property
    def num_samples(self) -> int:
        return len(self._indices)

    @property
    def indices(self) -> np.ndarray:
        return self._indices

    def _batches(self, budgeted: bool = False) -> Iterator[torch.Tensor]:
        """local_epochs passes, or local_steps batches; cycling until stopped when budgeted."""
        gen = torch.Generator().manual_seed(
            (self.spec.seed * 1_000_003 + self.part_index * 7919 + self._trained_rounds) % 2**63)
        loader = DataLoader(self._train, batch_size=self.spec.batch_size, shuffle=True, generator=gen)
        if self.spec.uses_steps or budgeted:
            done = 0
            while (budgeted or done < self.spec.local_steps) and len(self._train):
                for (batch,) in loader:
                    yield batch
                    done += 1
                    if done == self.spec.local_steps and not budgeted:
                        return
        else:
            for _ in range(self.spec.local_epochs):
                for (batch,) in loader:
                    yield batch

    # -- training and evaluation -----------------------------------------------------------

    def _autocast(self) -> Any:
        """The fitted precision's autocast (bf16 on sm_80+, fp16 on sm_70/75, else none);
        master weights and updates stay float32."""
        if self._fit is not None:
            return self._fit.autocast()
        cap = torch.cuda.get_device_capability(self.device) if self.device.type == "cuda" else None
        return plain_fit(self.device, self.spec.batch_size, choose_precision(self.device.type, cap)).autocast()

    def _loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = batch.to(self.device, non_blocking=True)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = self.model(input_ids=inputs).logits
        logits = logits.float().reshape(-1, logits.shape[-1])
        return nn.functional.cross_entropy(logits, targets.reshape(-1)), logits, targets.reshape(-1)

    def _fitted(self) -> DeviceFit:
        """Precision, micro-batch and threads for this device, probed once with real steps."""
        if self._fit is None:
            configure_threads(self.device)
            rows = self._train.tensors[0][: self.spec.batch_size]
            self.model.train()

            def step(micro: int, fit: DeviceFit) -> None:
                with fit.autocast():
                    loss = self._loss(rows[:micro])[0]
                loss.backward()
                for p in self._params:
                    p.grad = None

            self._fit = fit_device(self.device, max(1, min(self.spec.batch_size, len(rows))), step)
        return self._fit

    def fitted(self) -> dict[str, Any]:
        with self._lock:
            return self._fitted().describe()

    def train(self, base: np.ndarray, max_steps: int = 0, time_limit_s: float = 0.0,
              server_state: Mapping[str, np.ndarray] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Train the trainable tensors from ``base``; returns (trained − base, metrics). Under
        a time budget, at most ``max_steps`` steps and ``time_limit_s`` seconds.
        ``server_state`` is unused: the job files keep drift correction off language models."""
        configure_threads(self.device)
        with self._lock:
            fit = self._fitted()
            self._load(base)
            self.model.train()
            optimizer = make_optimizer(self.model, self.spec)
            if self.num_params > FOREACH_MAX_PARAMS:
                # torch's multi-tensor ("foreach") step allocates temporaries the size of all
                # trainable tensors at once: a few hundred MB each for a 100M model.
                for group in optimizer.param_groups:
                    group["foreach"] = False
            clip = self.settings["grad_clip"]
            budgeted = time_limit_s > 0
            stats = run_steps(self._batches(budgeted), fit, optimizer, lambda b: (self._loss(b)[0], len(b)),
                              max_steps=max_steps if budgeted else 0, time_limit_s=time_limit_s,
                              before_step=(lambda: torch.nn.utils.clip_grad_norm_(self._params, clip)) if clip > 0
                              else None)
            del optimizer  # its state (two copies of the trainable tensors for Adam) goes now
            for p in self._params:
                p.grad = None  # and the gradients: neither is needed until the next round
            self._trained_rounds += 1
            delta = self._flatten()
            np.subtract(delta, base, out=delta)
        metrics = stats.metrics(fit)
        fit.samples_per_s = metrics["samples_per_s"] or fit.samples_per_s
        return delta, {**metrics, "tokens": stats.samples * self.settings["seq_len"],
                       "dataset_size": self.num_samples}

    @torch.no_grad()
    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """Next-token loss, accuracy and perplexity on the first ``eval_sequences`` held-out rows."""
        configure_threads()
        began = time.perf_counter()
        with self._lock:
            self._load(params)
            self.model.eval()
            rows = self.text.test[: self.settings["eval_sequences"]]
            total, correct, count = 0.0, 0, 0
            for start in range(0, len(rows), max(1, self.spec.batch_size)):
                with self._autocast():
                    _, logits, targets = self._loss(rows[start:start + self.spec.batch_size])
                total += float(nn.functional.cross_entropy(logits, targets, reduction="sum"))
                correct += int((logits.argmax(dim=1) == targets).sum())
                count += int(targets.numel())
        if count == 0:
            return {"loss": math.nan, "accuracy": math.nan, "perplexity": math.nan}
        loss = total / count
        return {"loss": loss, "accuracy": correct / count, "perplexity": math.exp(min(loss, 50.0)),
                "eval_seconds": time.perf_counter() - began}

    # -- results ---------------------------------------------------------------------------

    def state_dict(self, params: np.ndarray) -> dict[str, torch.Tensor]:
        """The trainable tensors by name, on the CPU (the adapter alone under LoRA)."""
        vec = as_tensor(params)
        out, offset = {}, 0
        for name, p in trainable(self.model):
            n = p.numel()
            out[name] = vec[offset:offset + n].view(p.shape).clone()
            offset += n
        return out

    def export_model(self, params: np.ndarray, out: Path) -> list[Path]:
        """Hugging Face directories for ``params``: see gpuflex/ml/llm/export.py."""
        from gpuflex.ml.llm.export import export_llm

        with self._lock:
            self._load(params)
            return export_llm(self, out)
