"""Digits accuracy under client-side DP at ε ≈ 1, 4 and 8 (in-process simulation).

An **in-process simulation** (no node processes): 10 Workloads train the digits CNN from the
same base each round; every member's delta goes through the real member-side pipeline
(``DeltaEncoder.privatize``: clip to C, add N(0, (zC)^2)); the server averages (FedAvg). The
noise multiplier z for each target ε is calibrated with gpuflex.privacy for the run's number
of rounds at δ = 1e-5, sampling rate 1: the figures are what ``gpuflex job status`` would
show at the end of the job. ε is per member (user-level).

Run:

    python -m benchmarks.dp_accuracy [--rounds 10] [--clip 1.0] [--quick]
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from benchmarks.common import add_json_flag, emit, format_table, log, stop_on_sigterm

NODES = 10
JOB: dict[str, Any] = {"name": "dp", "model": "digits-cnn", "data": "sklearn-digits", "partition": "iid",
                       "local_epochs": 3, "batch_size": 32, "lr": 0.05, "optimizer": "momentum"}


def simulate(epsilon: float, rounds: int, clip: float, seed: int = 0) -> dict[str, Any]:
    from gpuflex.jobspec import JobSpec
    from gpuflex.ml.workload import Workload
    from gpuflex.node.core.pipeline import DeltaEncoder
    from gpuflex.privacy import epsilon_spent, noise_for_epsilon

    z = 0.0 if math.isinf(epsilon) else noise_for_epsilon(epsilon, rounds)
    dp = {"dp_clip": clip, "dp_noise_multiplier": z} if z > 0 else {}
    spec = JobSpec.from_dict({**JOB, "rounds": rounds, **dp})
    nodes = [Workload(spec, i, NODES) for i in range(NODES)]
    encoders = [DeltaEncoder(spec, rng=np.random.default_rng((seed, i))) for i in range(NODES)]
    params = nodes[0].initial_params()
    clipped, diverged = 0, False
    for _ in range(rounds):
        deltas = []
        for node, enc in zip(nodes, encoders, strict=True):
            delta, _ = node.train(params)
            if not np.all(np.isfinite(delta)):
                break
            deltas.append(enc.privatize(delta))
            clipped += enc.last_clip_scale < 1.0
        if len(deltas) < NODES:  # training from the noisy model blew up: chance level
            diverged = True
            break
        params = (params + np.mean(deltas, axis=0)).astype(np.float32)
    acc = 0.1 if diverged else float(nodes[0].evaluate(params)["accuracy"])
    return {"target_epsilon": epsilon, "noise_multiplier": z, "clip": clip if z else None,
            "epsilon_spent": epsilon_spent(spec, rounds) if z else math.inf, "accuracy": acc,
            "clipped_share": clipped / (rounds * NODES) if z else None, "diverged": diverged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="ε = 8 and no DP only")
    add_json_flag(parser)
    args = parser.parse_args()
    stop_on_sigterm()
    targets = (math.inf, 8.0) if args.quick else (math.inf, 8.0, 4.0, 1.0)
    rows = []
    for eps in targets:
        rows.append(simulate(eps, args.rounds, args.clip))
        log(f"ε={eps}: accuracy {rows[-1]['accuracy']:.3f}")
    cols = [("target_epsilon", "target ε", ".0f"), ("epsilon_spent", "ε spent (δ=1e-5)", ".2f"),
            ("noise_multiplier", "z", ".2f"), ("clip", "C", ".2f"), ("clipped_share", "clipped", ".2f"),
            ("accuracy", "accuracy", ".3f"), ("diverged", "diverged", "")]
    emit({"rounds": args.rounds, "nodes": NODES, "simulated": True, "rows": rows}, args.json,
         lambda r: format_table(r["rows"], cols))


if __name__ == "__main__":
    main()
