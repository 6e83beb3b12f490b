"""Nodes that share a process build their models in parallel threads; all must start equal."""

from __future__ import annotations

import threading

import numpy as np

from gpuflex.jobspec import JobSpec
from gpuflex.ml.workload import Workload


def test_workloads_built_in_parallel_threads_start_from_the_same_weights() -> None:
    spec = JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "seed": 3})
    results: dict[int, np.ndarray] = {}

    def build(i: int) -> None:
        results[i] = Workload(spec, i, 4).initial_params()

    threads = [threading.Thread(target=build, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 4
    assert all(np.array_equal(results[0], results[i]) for i in range(1, 4))
