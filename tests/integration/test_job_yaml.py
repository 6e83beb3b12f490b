"""A YAML job file submitted through the SDK runs on a real in-process mesh, with the spec the
TOML file that says the same thing gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflex import sdk
from gpuflex.client import ControlClient
from gpuflex.jobspec import JobSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

YAML_JOB = """\
# the digits job, as YAML
name: yaml-digits
model: digits-cnn
data: sklearn-digits
partition: iid
rounds: 2
local_epochs: 0
local_steps: 3
lr: 5e-2
min_nodes: 2
"""
TOML_JOB = """\
name = "yaml-digits"
model = "digits-cnn"
data = "sklearn-digits"
partition = "iid"
rounds = 2
local_epochs = 0
local_steps = 3
lr = 5e-2
min_nodes = 2
"""


def test_a_yaml_job_runs_through_the_sdk(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(YAML_JOB, encoding="utf-8")
    cluster = sdk.LocalCluster(tmp_path / "mesh", 2).start(timeout=90)
    try:
        handle = sdk.submit_file(tmp_path / "job.yaml", home=cluster.home(0))
        final = handle.wait(timeout=120)
        assert final["state"] == "done" and [m["round"] for m in final["metrics"]] == [1, 2]
        with ControlClient.for_home(cluster.home(1)) as client:  # the other node ran the same spec
            spec = client.job_status(handle.job_id)["spec"]
        expected = JobSpec.from_toml_text(TOML_JOB).to_dict()
        assert {k: spec.get(k) for k in expected} == expected
    finally:
        cluster.stop()
