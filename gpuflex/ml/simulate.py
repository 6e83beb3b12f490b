"""Federated averaging in one process, with no mesh: the reference the real rounds must match.

It is what the tuning of the demo defaults ran on, what tests use to check that a job
converges, and a quick way for a user to try a job before starting nodes. Plain FedAvg only
(weighted by sample count, server learning rate applied to the mean delta); the server
optimizers live in aggregation/.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpuflex.jobspec import JobSpec
from gpuflex.ml.workload import Workload


def simulate_fedavg(spec: JobSpec, num_parts: int, rounds: int | None = None) -> list[dict[str, Any]]:
    """Run ``rounds`` (default ``spec.rounds``) of FedAvg over ``num_parts`` in-process nodes.

    Returns one record per round: test loss and accuracy of the new global model, the mean
    local training loss, and the slowest node's local training seconds.
    """
    nodes = [Workload(spec, i, num_parts) for i in range(num_parts)]
    params = nodes[0].initial_params()
    history: list[dict[str, Any]] = []
    for r in range(1, (rounds or spec.rounds) + 1):
        start = time.perf_counter()
        deltas, weights, losses, seconds = [], [], [], []
        for node in nodes:
            delta, metrics = node.train(params)
            deltas.append(delta)
            weights.append(node.num_samples)
            losses.append(metrics["train_loss"])
            seconds.append(metrics["seconds"])
        mean = np.average(np.stack(deltas), axis=0, weights=np.asarray(weights, dtype=np.float64))
        params = (params + spec.server_lr * mean).astype(np.float32)
        scores = nodes[0].evaluate(params)
        history.append(
            {
                "round": r,
                "loss": scores["loss"],
                "accuracy": scores["accuracy"],
                "train_loss": float(np.average(losses, weights=weights)),
                "max_train_seconds": max(seconds),
                "round_seconds": time.perf_counter() - start,
            }
        )
    return history
