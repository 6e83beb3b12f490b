"""The production mesh and round code, 200 nodes at once, on the simulator's modelled network.

Each node is a real MeshNode and JobManager (``gpuflex.testing.sim``); the network
(``mesh.testing.simnet``) and the trainer are the only stand-ins, and trio's MockClock runs
modelled time. Half the nodes are behind NAT (half of those reachable by a hole punch). One
mesh, with a churn trace in the middle of the job (a node killed, one gone silent, one
joining late), is shared by the tests below (``scope="module"``), so the suite pays for it once.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from gpuflex.testing.sim import ChurnEvent, ChurnKind, SimConfig, Simulation

NODES = 200
ROUNDS = 3
KILLED, CRASHED, LATE = NODES - 2, NODES - 3, NODES - 1
#: Idle upkeep ceiling per node, whatever the mesh size: probes, presence, discovery.
IDLE_MSGS_PER_NODE_S = 40.0
#: Connections a node holds once idle: its keep set and the peers it still works with, far
#: fewer than the mesh (the overlay's D = 10, DHT nearest 8, bootstrap, a job's spread 16).
MAX_CONNECTIONS = 80
#: A stopped or silent node is ``down`` for every peer that knows it within this many modelled seconds.
DETECTION_S = 30.0


@pytest.fixture(scope="module")
def run() -> tuple[Simulation, dict[str, Any]]:
    logging.getLogger("mesh").setLevel(logging.ERROR)
    logging.getLogger("gpuflex").setLevel(logging.ERROR)
    cfg = SimConfig(nodes=NODES, rounds=ROUNDS, public_fraction=0.5, group_size=8, compute_s=2.0,
                    settle_s=15.0, late=1, seed=7,
                    churn=[ChurnEvent(3.0, ChurnKind.LEAVE, KILLED), ChurnEvent(3.0, ChurnKind.CRASH, CRASHED),
                           ChurnEvent(4.0, ChurnKind.JOIN, LATE)])
    sim = Simulation(cfg)

    async def main() -> dict[str, Any]:
        return await sim.run()

    try:
        report = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        sim.close()
    return sim, report


def test_every_round_commits_despite_the_churn(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    assert report["rounds_committed"] == ROUNDS, report["rounds"]
    assert all(r["contributors"] >= NODES // 2 for r in report["rounds"]), report["rounds"]


def test_no_accepted_update_is_lost_to_the_churn(run: tuple[Simulation, dict[str, Any]]) -> None:
    """Each live node's ledger has every committed round, with the same results (same head)
    as every other live node's; the updates each result accepted are in it for everyone."""
    sim, _ = run
    heads, accepted = set(), {}
    for node in sim.live():
        driver = sim._driver(node)
        if node.index == LATE and driver is None:
            continue  # it joined after the job: it syncs the ledger when it next hears presence
        assert driver is not None and driver.committed >= ROUNDS, node.index
        results = driver.book.ledger.results[:ROUNDS]
        heads.add(tuple(r.digest for r in results))
        for i, res in enumerate(results):
            accepted.setdefault(i, set()).add(frozenset(str(c.get("peer")) for c in res.contributors))
    assert len(heads) == 1
    assert all(len(sets) == 1 for sets in accepted.values())
    assert {r: set(p) for r, p in sim.accepted.items()} == {i + 1: set(next(iter(s))) for i, s in accepted.items()}


def test_idle_upkeep_per_node_is_bounded(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    idle = report["idle_per_node_s"]
    assert 0 < idle["msgs"] <= IDLE_MSGS_PER_NODE_S, idle
    assert report["connections_per_node"]["max"] <= MAX_CONNECTIONS, report["connections_per_node"]
    # Yet every node counts (nearly) every other as a member: by hearsay, not by contact.
    assert report["alive_view_mean"] >= 0.9 * (NODES - 3), report["alive_view_mean"]


def test_the_killed_and_the_silent_node_are_down_everywhere(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    assert report["crashed_undetected"] == [], report
    assert report["detection_s"][str(KILLED)] <= DETECTION_S, report["detection_s"]
    assert report["detection_s"][str(CRASHED)] <= DETECTION_S, report["detection_s"]
