"""Shakespeare by speaking role, the natural-skew task of ``benchmarks.noniid``: each member
holds whole roles, and a federated round of the benchmark's job runs on them. Skipped where the
text is not present (``GPUFLEX_SHARED_DATA`` or the checkout's shared/data)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.noniid import STRATEGIES, TASKS
from gpuflex.jobspec import JobSpec
from gpuflex.ml.workload import Workload
from gpuflex.nodeconfig import NodeConfig
from gpuflex.simulate import simulate

from .conftest import shared_data_dir


def test_three_members_hold_disjoint_roles_and_a_round_of_the_benchmark_job_runs() -> None:
    path = shared_data_dir() / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    config = NodeConfig(data={"shakespeare": Path(path)})
    spec = JobSpec.from_dict({**TASKS["shakespeare"], **STRATEGIES["default"], "rounds": 1, "local_steps": 2})
    nodes = [Workload(spec, i, 3, config=config) for i in range(3)]
    groups = nodes[0].bundle.groups
    assert groups is not None
    roles = [set(np.unique(groups[node.indices]).tolist()) for node in nodes]
    assert all(roles) and not (roles[0] & roles[1] or roles[0] & roles[2] or roles[1] & roles[2])
    assert set().union(*roles) == set(np.unique(groups).tolist())
    history = simulate(spec, 3, config=config)
    assert len(history) == 1 and history[0]["steps"] == 2
    assert math.isfinite(history[0]["loss"]) and 0.0 <= history[0]["accuracy"] <= 1.0
