"""A node started with a metrics address serves every named metric while a job runs."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpuflex import sdk
from gpuflex.client import ControlClient
from tests.unit.workflow import sdk_fixtures as fx

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NAMED = ('gpuflex_peers{state="up"}', "gpuflex_rounds_committed_total{", "gpuflex_round_duration_seconds_bucket{",
         "gpuflex_bytes_sent_total", "gpuflex_bytes_received_total", "# TYPE gpuflex_updates_rejected_total counter",
         "gpuflex_local_samples_per_second{")


def scrape(addr: tuple[str, int]) -> str:
    with urllib.request.urlopen(f"http://{addr[0]}:{addr[1]}/metrics", timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return reply.read().decode()


def value(text: str, prefix: str) -> float:
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_metrics_during_a_job(tmp_path: Path) -> None:
    spec = sdk.build_spec(fx.make_model, fx.make_data, in_process=True, rounds=3, local_steps=5, lr=0.2)
    plugins = [spec[field] for field in ("model", "data")]  # these nodes' operator allows this job's code
    cluster = sdk.LocalCluster(tmp_path, 2, metrics={0: "127.0.0.1:0"}, allow_plugins=plugins).start(60)
    try:
        addr = cluster.runtimes[0].metrics_addr
        assert addr is not None and addr[0] == "127.0.0.1"
        assert value(scrape(addr), 'gpuflex_peers{state="up"}') == 1
        with ControlClient.for_home(cluster.home(0)) as client:
            job = client.submit(spec)["job_id"]
            deadline = time.monotonic() + 60
            while client.job_status(job)["round"] < 1:  # mid-job: one round in, more to come
                assert time.monotonic() < deadline, "no round committed"
                time.sleep(0.1)
            text = scrape(addr)
            for name in NAMED:
                assert name in text, name
            assert value(text, f'gpuflex_rounds_committed_total{{job="{job}"}}') >= 1
            assert value(text, "gpuflex_bytes_sent_total") > 0 and value(text, "gpuflex_bytes_received_total") > 0
            assert value(text, f'gpuflex_local_samples_per_second{{job="{job}"}}') > 0
            while client.job_status(job)["state"] != "done":
                assert time.monotonic() < deadline, "job not done"
                time.sleep(0.2)
        assert value(scrape(addr), f'gpuflex_round_duration_seconds_count{{job="{job}"}}') == 3
    finally:
        cluster.stop()


def test_bad_metrics_address_is_a_one_line_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuflex", "node", "start", "--home", str(tmp_path),
                           "--listen", "/ip4/127.0.0.1/tcp/0", "--metrics", "localhost:http"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "error: --metrics must be PORT or HOST:PORT" in proc.stderr
