"""The Python SDK runs a 3-node in-process job end to end, and the control client agrees with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpuflex import doctor, sdk
from gpuflex.client import ControlClient
from tests.integration.conftest import load_factor
from tests.unit.workflow import sdk_fixtures as fx

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_three_node_in_process_job_returns_a_loadable_state_dict(tmp_path: Path) -> None:
    # An in-process callable (a lambda) next to importable ones and a custom training loop.
    handle = sdk.run_local(lambda num_classes, input_shape: fx.make_model(num_classes, input_shape),
                           fx.make_data, train_fn=fx.sgd_loop, nodes=3, rounds=3, local_steps=5,
                           batch_size=16, lr=0.1, workdir=tmp_path / "mesh")
    with handle:
        rows = list(handle.stream(timeout=120))
        assert [r["round"] for r in rows] == [1, 2, 3]
        assert all(r["contributors"] == 3 for r in rows)
        final = handle.wait(timeout=10)
        assert final["state"] == "done" and final["metrics"] == rows
        assert rows[-1]["accuracy"] > 0.8

        model = fx.make_model(3, (5,))
        model.load_state_dict(handle.state_dict())

        files = {p.name for p in handle.results(tmp_path / "results")}
        assert {"model.pt", "metrics.csv", "metrics.png", "job.json"} <= files

        with ControlClient.for_home(handle.home) as client:  # the CLI's --json data, from Python
            assert client.status()["mesh"]["up"] == 2
            assert len(client.peers()) == 2
            assert client.jobs()[0]["job_id"] == handle.job_id
            assert client.job_status(handle.job_id)["state"] == "done"
            assert [r["round"] for r in client.ledger(handle.job_id)] == [1, 2, 3]

        checks = {f.check: f for f in doctor.run_checks(handle.home, "/ip4/127.0.0.1/tcp/0")}
        assert checks["clock"].status == "OK" and checks["clock"].data["peers_compared"] == 2
        assert abs(checks["clock"].data["node_offset_s"]) < 1.0
    assert handle.state_dict().keys() == model.state_dict().keys()  # kept after the mesh stopped


def test_a_model_function_of_the_wrong_shape_fails_the_job_clearly(tmp_path: Path) -> None:
    with sdk.run_local(fx.not_a_model, fx.make_data, nodes=2, rounds=1, local_steps=1,
                       workdir=tmp_path / "mesh") as handle, pytest.raises(sdk.JobFailed) as err:
        handle.wait(timeout=60)
    assert "expected a torch.nn.Module" in str(err.value)


@pytest.mark.timeout(660)  # the example's own bound scales with the machine's load, to 600 s
def test_readme_sdk_example_runs(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    match = re.search(r"<!-- sdk-example -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README lost its SDK example"
    script = tmp_path / "sdk_example.py"
    script.write_text(match.group(1))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150 * load_factor(),
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["1", "2", "3"]


def test_the_sdk_gives_a_central_baseline_and_the_best_rounds_model(tmp_path: Path) -> None:
    handle = sdk.run_local(fx.make_model, fx.make_data, nodes=2, rounds=3, local_steps=5, batch_size=16, lr=0.1,
                           workdir=tmp_path / "mesh")
    with handle:
        final = handle.wait(timeout=150)
        central = handle.baseline()
        assert 0.0 <= central["accuracy"] <= 1.0 and central["steps"] == 3 * 5  # the same sequential budget
        best = handle.best_round("accuracy")
        assert best["accuracy"] == max(m["accuracy"] for m in final["metrics"])
        # The job's default final model is the best-scored round's; the last round's is there too.
        final_state = handle.state_dict()
        for key, value in handle.state_dict("best").items():
            assert torch.equal(value, final_state[key])
        assert handle.state_dict("last").keys() == final_state.keys()
