"""Central training on the union of the training data: the yardstick for federated results.

The demo prints "federated vs central" so users can see what federation costs. For the
comparison to be fair the central run uses the same model, seed, optimizer, test split and
sequential training budget: ``rounds × local_epochs`` epochs, or ``rounds × local_steps``
steps when the job counts steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from gpuflex.jobspec import JobSpec
from gpuflex.ml.models import build_model
from gpuflex.ml.train import evaluate, local_train, pick_device
from gpuflex.ml.workload import load_bundle, resolve_data_path
from gpuflex.nodeconfig import NodeConfig


def seeded_train(spec: JobSpec, model: Any, train: Any, budget: JobSpec, device: Any,
                 before_step: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train ``model`` centrally on ``train`` for ``budget``, its shuffles and dropout seeded
    by ``spec.seed`` (the caller's RNG untouched): unseeded, three epochs of the demo scored
    anywhere from 0.79 to 0.96, so the yardstick moved with whatever ran before it."""
    loader = DataLoader(train, batch_size=spec.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(spec.seed % 2**63))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        return local_train(model, loader, budget, device, before_step=before_step)


def central_baseline(spec: JobSpec, epochs: int | None = None, config: NodeConfig | None = None) -> dict[str, Any]:
    """Train centrally and score on the job's test split; ``epochs`` overrides the budget.
    ``config`` says where named data sets live (the sklearn sets need none)."""
    bundle = load_bundle(spec, resolve_data_path(spec, config or NodeConfig()))
    if epochs is not None:
        budget = dataclasses.replace(spec, local_epochs=epochs, local_steps=0)
    elif spec.uses_steps:
        budget = dataclasses.replace(spec, local_steps=spec.rounds * spec.local_steps)
    else:
        budget = dataclasses.replace(spec, local_epochs=spec.rounds * spec.local_epochs)
    device = pick_device()
    model = build_model(spec, bundle)
    start = time.perf_counter()
    metrics = seeded_train(spec, model, bundle.train, budget, device)
    seconds = time.perf_counter() - start
    scores = evaluate(model, bundle.test, device)
    return {
        "accuracy": scores["accuracy"],
        "loss": scores["loss"],
        "train_loss": metrics["train_loss"],
        "epochs": budget.local_epochs if not budget.uses_steps else None,
        "steps": metrics["steps"],
        "seconds": seconds,
    }
