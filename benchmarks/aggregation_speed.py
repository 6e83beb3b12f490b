"""Throughput of the aggregation layer against memcpy on the same machine.

Memory bandwidth differs tenfold between a laptop and a server, so absolute
GB/s say little; every figure is also given as a ratio to ``np.copyto`` of a
buffer of the same size, measured in the same run. Run:

    python -m benchmarks.aggregation_speed [--mb 100] [--n 8] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from aggregation import (
    WeightedAccumulator,
    centered_clipping,
    coordinate_median,
    krum,
    make_codec,
    multi_krum,
    norm_bound,
    trimmed_mean,
    weighted_mean,
)


def _best_seconds(func: Callable[[], Any], reps: int) -> float:
    """Best of ``reps`` runs: the least disturbed by the OS and other processes."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
    return best


def _accumulate(vectors: list[np.ndarray], weights: list[float]) -> np.ndarray:
    acc = WeightedAccumulator(vectors[0].size)
    for vec, weight in zip(vectors, weights, strict=True):
        acc.add(vec, weight)
    return acc.result()


def run(mb: float, n: int, reps: int) -> list[dict[str, Any]]:
    """Measure every operation; return one row per operation."""
    size = int(mb * 1e6) // 4
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(size, dtype=np.float32) for _ in range(n)]
    weights = [float(w) for w in rng.uniform(1, 100, n)]
    one = vectors[0]
    scratch = np.empty_like(one)
    one_bytes, all_bytes = one.nbytes, one.nbytes * n

    cases: list[tuple[str, int, Callable[[], Any]]] = [
        ("memcpy (np.copyto)", one_bytes, lambda: np.copyto(scratch, one)),
        ("weighted_mean", all_bytes, lambda: weighted_mean(vectors, weights)),
        ("WeightedAccumulator", all_bytes, lambda: _accumulate(vectors, weights)),
        ("coordinate_median", all_bytes, lambda: coordinate_median(vectors)),
        ("trimmed_mean beta=0.25", all_bytes, lambda: trimmed_mean(vectors, 0.25)),
        ("krum f=(n-3)//2", all_bytes, lambda: krum(vectors, (n - 3) // 2)),
        ("multi_krum f=(n-3)//2", all_bytes, lambda: multi_krum(vectors, (n - 3) // 2)),
        ("centered_clipping it=3", all_bytes, lambda: centered_clipping(vectors, 1.0)),
        ("norm_bound clip", all_bytes, lambda: norm_bound(vectors)),
    ]
    for name in ("none", "fp16", "int8", "topk"):
        codec = make_codec(name)
        encoded = codec.encode(one)
        cases.append((f"{name} encode", one_bytes, lambda c=codec: c.encode(one)))
        cases.append((f"{name} decode", one_bytes, lambda c=codec, e=encoded: c.decode(e)))

    rows: list[dict[str, Any]] = []
    memcpy = 0.0
    for label, nbytes, func in cases:
        func()  # warm up: page in buffers, build caches
        seconds = _best_seconds(func, reps)
        gbps = nbytes / seconds / 1e9
        memcpy = memcpy or gbps
        rows.append({"op": label, "seconds": seconds, "gb_per_s": gbps, "vs_memcpy": gbps / memcpy})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="MB of float32 per vector")
    parser.add_argument("--n", type=int, default=8, help="number of vectors (peers)")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions; best is kept")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    rows = run(args.mb, args.n, args.reps)
    if args.json:
        print(json.dumps({"mb": args.mb, "n": args.n, "rows": rows}, indent=2))
        return
    print(f"{args.n} x {args.mb:g} MB float32; GB/s of input, best of {args.reps}")
    print(f"{'operation':<26}{'seconds':>10}{'GB/s':>9}{'x memcpy':>10}")
    for row in rows:
        print(
            f"{row['op']:<26}{row['seconds']:>10.4f}{row['gb_per_s']:>9.2f}"
            f"{row['vs_memcpy']:>10.2f}"
        )


if __name__ == "__main__":
    main()
