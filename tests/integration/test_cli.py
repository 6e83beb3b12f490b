"""The CLI as a user meets it: one clear line on error, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def gpuflex(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuflex", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def assert_clean_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr  # one clear line (a job file error lists its fields below it)
    for needle in needles:
        assert needle in proc.stderr


def test_query_without_a_running_node(tmp_path: Path) -> None:
    assert_clean_error(gpuflex("peers", "--home", str(tmp_path)), "no node is running")
    assert_clean_error(gpuflex("status", "--json", env={"GPUFLEX_HOME": str(tmp_path)}), "no node is running")


def test_keygen_creates_a_private_key(tmp_path: Path) -> None:
    proc = gpuflex("keygen", "--home", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "identity.key").stat().st_mode & 0o777 == 0o600
    again = gpuflex("keygen", "--home", str(tmp_path))
    assert "exists" in again.stdout


def test_node_refuses_a_key_readable_by_others(tmp_path: Path) -> None:
    gpuflex("keygen", "--home", str(tmp_path))
    os.chmod(tmp_path / "identity.key", 0o644)
    proc = gpuflex("node", "start", "--home", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/0")
    assert_clean_error(proc, "chmod 600")


def test_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = gpuflex("node", "start", "--home", str(tmp_path), "--listen", f"/ip4/127.0.0.1/tcp/{port}")
    assert_clean_error(proc, "already in use")


def test_unreachable_bootstrap(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/12D3KooWEsBg6ZLAErGHspDcha3diQ1YzdqbwtymooqWTezidasB"
    proc = gpuflex("node", "start", "--home", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/0",
                   "--bootstrap", addr, "--bootstrap-timeout", "3", timeout=90)
    assert_clean_error(proc, "cannot reach any bootstrap peer")


def test_bad_job_files_list_every_error_by_field(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('model = "resnet-9000"\ndata = "cifar10"\ndata_path = "/no/such/dir"\nrounds = "ten"\n'
                   'group_size = 1\nlrr = 0.1\n')
    proc = gpuflex("job", "submit", str(job), "--node", str(tmp_path))
    assert_clean_error(proc, "model:", "data_path:", "rounds:", "group_size:", "lrr:")
    missing = tmp_path / "missing.toml"
    missing.write_text('rounds = 3\n')
    assert_clean_error(gpuflex("job", "submit", str(missing)), "model: is required", "data: is required")
    assert_clean_error(gpuflex("job", "submit", str(tmp_path / "nope.toml")), "does not exist")
    garbled = tmp_path / "garbled.toml"
    garbled.write_text("model = [\n")
    assert_clean_error(gpuflex("job", "submit", str(garbled)))


def test_job_init_writes_a_valid_example(tmp_path: Path) -> None:
    from gpuflex.jobspec import JobSpec

    path = tmp_path / "job.toml"
    assert gpuflex("job", "init", str(path)).returncode == 0
    assert JobSpec.from_toml(path).model == "digits-cnn"
    assert_clean_error(gpuflex("job", "init", str(path)), "exists")


def test_control_api_needs_the_token(mesh_factory) -> None:
    import json

    mesh = mesh_factory(1)
    mesh.start()
    info = json.loads((mesh.home(0) / "control.json").read_text())
    assert info["host"] == "127.0.0.1"
    assert (mesh.home(0) / "control.token").stat().st_mode & 0o777 == 0o600
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=5) as conn:
        conn.sendall(b'{"token": "wrong", "method": "status"}\n')
        reply = json.loads(conn.makefile().readline())
    assert reply == {"ok": False, "error": "unauthorized"}
    status = json.loads(gpuflex("status", "--json", "--home", str(mesh.home(0))).stdout)
    assert status["peer_id"].startswith("12D3KooW")
    assert all("/p2p/" in a for a in status["addrs"])
