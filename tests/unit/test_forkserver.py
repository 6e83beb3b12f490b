"""The node launcher of local meshes: a forked child is a process of its own, with the argv,
environment, working directory and log it was given, in a session of its own (so a mesh can
kill its process group), ignoring SIGPIPE as a fresh interpreter does, and its exit code and
death by signal are reported as ``subprocess.Popen`` reports them."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from gpuflex import forkserver

pytestmark = pytest.mark.skipif(not forkserver.enabled(), reason="no fork() here, or GPUFLEX_LAUNCH=exec")


def test_a_forked_child_gets_its_own_argv_env_cwd_session_and_exit_code(tmp_path: Path) -> None:
    server = forkserver.shared()
    log = tmp_path / "child.log"
    env = {**os.environ, "FORKCHILD_MARK": "m1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = server.spawn(["3"], env, log, cwd=tmp_path, module="tests.unit.forkchild")
    assert child.wait(timeout=60) == 3
    seen = json.loads(log.read_text().strip().splitlines()[-1])
    assert seen["argv"] == ["3"] and seen["env"] == "m1" and seen["cwd"] == str(tmp_path)
    assert seen["sid"] == seen["pid"] == child.pid != os.getpid()
    assert seen["sigpipe_ignored"]


def test_a_killed_child_reports_the_signal_like_popen(tmp_path: Path) -> None:
    server = forkserver.shared()
    child = server.spawn(["node", "start", "--home", str(tmp_path / "home"), "--listen", "/ip4/127.0.0.1/tcp/0",
                          "--no-mdns"], dict(os.environ), tmp_path / "node.log")
    assert child.poll() is None
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL and child.returncode == -signal.SIGKILL
