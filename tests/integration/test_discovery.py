"""Twelve real node processes find each other through the DHT; a killed one goes down."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import load_factor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def cli_peers(home: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "gpuflex", "peers", "--json", "--home", home],
                         capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


def test_twelve_nodes_discover_each_other_and_detect_a_kill(mesh_factory) -> None:
    mesh = mesh_factory(12)
    mesh.start(timeout=120)
    homes = [str(mesh.home(i)) for i in range(12)]
    ids = {mesh.call(i, "status")["peer_id"] for i in range(12)}

    # Every node was given only node 0's address; all must list the other 11 as up, with NodeInfo.
    # Polled through the control API (a CLI process per node per poll would eat the CPU the
    # nodes need); the CLI's own output is checked once discovery is done.
    def all_known() -> bool:
        for i in range(12):
            rows = mesh.call(i, "peers")
            good = [r for r in rows if r["state"] == "up" and r["info"] and r["info"]["peer_id"] == r["peer_id"]]
            if len(good) < 11:
                return False
        return True

    budget = 30 * load_factor()  # 30 s on an idle machine; see load_factor
    waited = mesh.wait_until(all_known, timeout=budget, interval=1.0, what="12-node discovery")
    assert waited <= budget
    rows = cli_peers(homes[5])
    assert {r["peer_id"] for r in rows} == ids - {mesh.call(5, "status")["peer_id"]}
    assert all(r["state"] == "up" and r["info"] for r in rows)
    info = rows[0]["info"]
    for key in ("version", "os", "cpu_count", "ram_bytes", "accelerators", "torch", "legacy", "addrs"):
        assert key in info

    victim = mesh.call(7, "status")["peer_id"]
    mesh.kill(7, signal.SIGKILL)
    killed_at = time.time()
    others = [i for i in range(12) if i != 7]

    def marked_down() -> bool:
        return all(next(p for p in mesh.call(i, "peers") if p["peer_id"] == victim)["state"] == "down"
                   for i in others)

    detect = 15 * load_factor()  # down_after (9 s) plus a probe sweep, on an idle machine
    mesh.wait_until(marked_down, timeout=detect, interval=0.5, what="killed peer marked down")
    assert time.time() - killed_at <= detect + 0.5
