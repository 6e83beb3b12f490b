"""The order in which the suite's files reach the workers.

`just test` runs four workers, a file each at a time (``--dist loadfile``). A file that takes
two minutes and starts last keeps the run going two minutes after the others are done, so the
files measured longest (their wall seconds in a whole run on a two-core machine, `--durations`)
go first, in this order; every other file keeps its place after them. Every worker computes the same order,
as xdist requires. Run with ``--no-loadscope-reorder`` so that xdist keeps it.
"""

from __future__ import annotations

import pytest

#: Longest first. A file missing here is only scheduled later, never skipped.
LONGEST_FIRST = (
    "tests/integration/test_hostile_claims.py",
    "tests/integration/test_partition.py",
    "tests/integration/test_hostile_relay.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_open_job_sybils.py",
    "tests/integration/test_hostile_rounds.py",
    "tests/integration/test_hostile_resources.py",
    "tests/integration/test_serving.py",
    "tests/integration/test_secagg_dropout.py",
    "tests/integration/test_heterogeneous.py",
    "tests/integration/test_nat.py",
    "tests/unit/workflow/test_bench_venvs.py",
    "tests/integration/test_hostile_plugins.py",
    "tests/integration/test_serving_nat.py",
    "tests/tui/test_app.py",
    "tests/unit/ml/test_fedavg.py",
    "tests/integration/test_rounds.py",
    "tests/integration/test_hostile_jobs.py",
    "tests/web/test_browser.py",
    "tests/integration/test_discovery.py",
    "tests/integration/test_hostile_secagg_groups.py",
    "tests/integration/test_sdk.py",
    "tests/integration/test_cli_doctor.py",
    "tests/integration/test_llm.py",
    "tests/unit/node/test_simulated_mesh.py",
    "tests/integration/test_rejoin.py",
    "tests/unit/mesh/test_dialer.py",
    "tests/integration/test_late_join.py",
    "tests/packaging/test_container.py",
)
_RANK = {path: rank for rank, path in enumerate(LONGEST_FIRST)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return _RANK.get(item.nodeid.partition("::")[0], len(_RANK))

    items.sort(key=rank)  # stable: the tests of a file, and the files not named, keep their order
