"""``gpuflex doctor --job`` as a user runs it: a job that would run passes, a bad one lists every error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuflex.nodeconfig import dump_node_config
from tests.integration.test_cli import gpuflex
from tests.unit.ml.conftest import PLAY, shared_data_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def play_home(tmp_path: Path) -> Path:
    """A home whose node.toml names the play, as the LoRA template's comments tell a user to."""
    real = shared_data_dir() / "tinyshakespeare.txt"
    text = real if real.is_file() else tmp_path / "play.txt"
    if not real.is_file():
        text.write_text("\n".join([PLAY] * 40), encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    (home / "node.toml").write_text(dump_node_config({"data": {"shakespeare": str(text)}}))
    return home


def test_doctor_passes_the_lora_template_that_runs_here(tmp_path: Path) -> None:
    pytest.importorskip("peft", reason="needs the llm extra: pip install 'gpuflex[llm]'")
    home = play_home(tmp_path)
    job = tmp_path / "lora.toml"
    assert gpuflex("job", "init", str(job), "--template", "lora").returncode == 0
    proc = gpuflex("doctor", "--home", str(home), "--listen", "127.0.0.1:0", "--job", str(job), "--json",
                   timeout=200)
    report = json.loads(proc.stdout)
    fits = [f for f in report["findings"] if f["check"].startswith(("fit ", "job-fit"))]
    assert fits and all(f["status"] == "OK" for f in fits), fits
    assert "tokenizer hash" not in proc.stdout
    cpu = next(f for f in fits if f["check"] == "fit cpu")
    assert cpu["data"]["samples_per_s"] > 0


def test_doctor_lists_every_error_of_a_bad_job_like_submit(tmp_path: Path) -> None:
    job = tmp_path / "bad.toml"
    job.write_text('model = "resnet-9000"\ndata = "cifar10"\nrounds = "ten"\nlrr = 0.1\n')
    submit = gpuflex("job", "submit", str(job), "--node", str(tmp_path))
    doctor = gpuflex("doctor", "--home", str(tmp_path), "--listen", "127.0.0.1:0", "--job", str(job))
    assert doctor.returncode == 1 and "Traceback" not in doctor.stdout + doctor.stderr
    fields = [line.split(":")[0].strip() for line in submit.stderr.splitlines()[1:] if ":" in line]
    assert len(fields) == 3, submit.stderr
    for field in fields:
        assert f"  {field}:" in doctor.stdout, doctor.stdout


def test_doctor_checks_the_running_nodes_own_address_and_sees_loopback(mesh_factory) -> None:
    mesh = mesh_factory(1)
    mesh.start(timeout=120)
    status = mesh.call(0, "status")
    port = status["addrs"][0].split("/tcp/")[1].split("/")[0]
    proc = gpuflex("doctor", "--home", str(mesh.home(0)), "--json", timeout=200)
    findings = {f["check"]: f for f in json.loads(proc.stdout)["findings"]}
    # the node's own port, not 4001 (which may be free, or someone else's)
    assert findings["port"]["status"] == "OK" and f"/ip4/127.0.0.1/tcp/{port}" in findings["port"]["message"]
    assert "4001" not in findings["port"]["message"]
    # a node on loopback serves nobody else, whatever its peers said
    reach = findings["reachability"]
    assert reach["status"] == "WARN" and "loopback only" in reach["message"], reach
    assert f"--listen /ip4/0.0.0.0/tcp/{port}" in reach["fix"]
