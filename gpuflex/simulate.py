"""Federated rounds in one process, with no mesh: the reference the real rounds must match.

It is what the tuning of the demo defaults ran on, what tests use to check that a job
converges, what the communication benchmarks count bytes with, and a quick way for a user to
try a job before starting nodes. The numbers go through the node's own code: each member's
delta through the job's encoder (DP, codec) and the leader's decoder and reducer
(gpuflex/node/core/pipeline.py), and the root's step through the job's server optimizer
(aggregation/server_opt.py), so what converges here converges the same way on a mesh.
Transport, signatures and the tree are left out; they do not touch the numbers.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from gpuflex.jobspec import JobSpec
from gpuflex.ml.workload import open_workload
from gpuflex.nodeconfig import NodeConfig


def simulate(
    spec: JobSpec,
    num_parts: int,
    rounds: int | None = None,
    *,
    error_feedback: bool | None = None,
    eval_every: int = 1,
    config: NodeConfig | None = None,
) -> list[dict[str, Any]]:
    """Run ``rounds`` (default ``spec.rounds``) of the job over ``num_parts`` in-process nodes.

    ``error_feedback`` overrides the job's setting (whether a lossy codec's residual is
    carried into the member's next update). The model is evaluated every ``eval_every``
    rounds and after the last. ``config`` says where named data sets live (node.toml's
    ``[data]``), for data sets that are files.

    Returns one record per round: test loss and accuracy of the new global model (NaN when not
    evaluated that round), the mean local training loss, optimizer steps per member, the
    slowest node's local training seconds, and the bytes on the wire: every member's encoded
    update (``upload_bytes``) and what every member downloads to hold the committed model
    (``download_bytes``): the encoded step where the job's codec lets members replay it,
    else the model blob, optimizer state included. With ``fragments`` > 1 a round syncs one
    fragment, and each member trains on from its own model as a node does
    (gpuflex/node/ownmodel.py): the fragment synced last round is the committed model's.
    """
    from aggregation.fragments import round_span, synced_since
    from gpuflex.node.core.modelblob import pack_model
    from gpuflex.node.core.outerstep import outer_step
    from gpuflex.node.core.pipeline import DeltaEncoder, decode_payload, make_reducer

    if error_feedback is not None:
        spec = dataclasses.replace(spec, error_feedback=error_feedback)
    nodes = [open_workload(spec, i, num_parts, config=config or NodeConfig()) for i in range(num_parts)]
    encoders = [DeltaEncoder(spec) for _ in nodes]
    params = nodes[0].initial_params()
    state: dict[str, np.ndarray] = {}
    # fragments > 1: each member's own model, synced one fragment a round (gpuflex/node/ownmodel.py)
    own: list[np.ndarray] = [params] * num_parts
    total = rounds or spec.rounds
    history: list[dict[str, Any]] = []
    for r in range(1, total + 1):
        start = time.perf_counter()
        reducer = make_reducer(spec, is_root=True)
        losses, weights, seconds, steps, uploaded = [], [], [], [], 0
        span = round_span(params.size, spec.fragments, r) if spec.fragments > 1 else None
        for i, (node, encoder) in enumerate(zip(nodes, encoders, strict=True)):
            if span is None:
                delta, metrics = node.train(params, server_state=state)
            else:  # from its own model, the fragment synced last round taken from the committed one
                begin = synced_since(own[i], params, spec.fragments, r - 1, r - 1) if r > 1 else params
                trained, metrics = node.train(begin, server_state=state)
                own[i] = begin + trained
                delta = own[i][span.start:span.stop] - params[span.start:span.stop]
            payload = encoder.encode(delta, node.num_samples, span=span)
            uploaded += len(payload)
            reducer.add(decode_payload(spec, payload, delta.size), node.num_samples, f"node-{i}")
            losses.append(metrics["train_loss"])
            weights.append(node.num_samples)
            seconds.append(metrics["seconds"])
            steps.append(metrics["steps"])
        params, state, step = outer_step(spec, params, state, reducer.result(), r)
        params = np.asarray(params, dtype=np.float32)
        scores = (nodes[0].evaluate(params) if r % eval_every == 0 or r == total
                  else {"loss": float("nan"), "accuracy": float("nan")})
        history.append(
            {
                "round": r,
                "loss": scores["loss"],
                "accuracy": scores["accuracy"],
                "train_loss": float(np.average(losses, weights=weights)),
                "steps": float(np.mean(steps)),
                "upload_bytes": uploaded,
                "download_bytes": num_parts * len(step if step is not None else pack_model(params, state)),
                "max_train_seconds": max(seconds),
                "round_seconds": time.perf_counter() - start,
            }
        )
    return history


def simulate_fedavg(spec: JobSpec, num_parts: int, rounds: int | None = None) -> list[dict[str, Any]]:
    """Plain FedAvg with raw float32 deltas, whatever strategy and codec the job names: the
    demo's contract, which its convergence test checks."""
    return simulate(dataclasses.replace(spec, strategy="fedavg", codec="none"), num_parts, rounds)
