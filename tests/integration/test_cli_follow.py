"""Following jobs from the CLI on a real mesh: ``job status --watch`` redraws in place on a
terminal and prints only what changed into a pipe; ``job list`` is newest first (after a
restart too) in aligned columns; every round says what its updates weighed."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import light_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def watch_in_pty(args: list[str], timeout: float) -> str:
    """Run ``gpuflex ARGS`` with its stdout on a pseudo-terminal; everything it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpuflex", *args], stdout=follower, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "120"})
    os.close(follower)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    return out.decode(errors="replace")


def test_watch_list_and_round_bytes(mesh_factory) -> None:
    mesh = mesh_factory(2)
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    home = str(mesh.home(0))
    older = mesh.submit(light_spec(rounds=1, name="older"))
    mesh.wait_job(older, [0, 1], timeout=150)
    rounds = 6
    newer = mesh.submit(light_spec(rounds=rounds, name="newer"))
    piped = subprocess.Popen([sys.executable, "-m", "gpuflex", "job", "status", newer, "--node", home, "--watch"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    screen = watch_in_pty(["job", "status", newer, "--node", home, "--watch"], timeout=240)
    out, err = piped.communicate(timeout=60)
    assert piped.returncode == 0, err

    # A pipe gets each line once a change: one row per round, one header, not a snapshot a second.
    rows = [line for line in out.splitlines() if re.match(r"\s+\d+\s+\d\.\d{4}", line)]
    assert sorted(int(r.split()[0]) for r in rows) == list(range(1, rounds + 1)), out
    assert sum(line.lstrip().startswith("round ") and "loss" in line for line in out.splitlines()) == 1, out
    # A terminal is redrawn: every refresh clears the screen and draws the whole snapshot.
    frames = screen.split("\x1b[H\x1b[2J")
    assert len(frames) >= 2 and frames[0] == "", screen[:500]
    assert f"round {rounds}/{rounds}" in frames[-1] and all("job " in f for f in frames[1:])

    # Every round says what its updates weighed: the MLP's delta, float32 (codec none).
    status = mesh.job(0, newer)
    for m in status["metrics"]:
        assert m["update_bytes"] > 0 and m["down_bytes"] > 0
        assert m["perplexity"] is None  # a classifier has none
    assert "up MB" in next(line for line in out.splitlines() if "train loss" in line)

    # Newest first, after a restart as well (job ids say nothing about age).
    for restarted in (False, True):
        if restarted:
            mesh.call(0, "shutdown")
            mesh.procs[0].wait(60)
            mesh.start_node(0, timeout=120)
        listed = subprocess.run([sys.executable, "-m", "gpuflex", "job", "list", "--node", home],
                                capture_output=True, text=True, timeout=60)
        lines = listed.stdout.splitlines()
        assert [line.split()[0] for line in lines[1:]] == [newer, older], listed.stdout
        # aligned: every column starts where its header does
        for header in ("STATE", "PHASE", "NAME"):
            col = lines[0].index(header)
            assert all(line[col - 2:col] == "  " and line[col] != " " for line in lines[1:]), listed.stdout
        bare = mesh.call(0, "job_status", {})
        assert bare["job_id"] == newer
