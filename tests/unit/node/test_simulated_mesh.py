"""The production mesh and round code, many nodes at once, on the simulator's modelled network.

Each node is a real MeshNode and JobManager (``gpuflex.testing.sim``); the network
(``mesh.testing.simnet``) and the trainer are the only stand-ins, and trio's MockClock runs
modelled time. One mesh, with a node that crashes silently in the middle of the job, is shared
by the tests below (``scope="module"``), so the suite pays for it once.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpuflex.testing.sim import ChurnEvent, ChurnKind, SimConfig, Simulation, run_simulation

NODES = 24
ROUNDS = 4
CRASHED = NODES - 1
#: Idle upkeep ceiling per node, whatever the mesh size: probes, presence, discovery.
IDLE_MSGS_PER_NODE_S = 40.0
#: A crashed node is ``down`` for every peer within this many modelled seconds.
DETECTION_S = 30.0


@pytest.fixture(scope="module")
def run() -> tuple[Simulation, dict[str, Any]]:
    logging.getLogger("mesh").setLevel(logging.ERROR)
    cfg = SimConfig(nodes=NODES, rounds=ROUNDS, public_fraction=0.5, group_size=4, compute_s=2.0,
                    settle_s=25.0, churn=[ChurnEvent(4.0, ChurnKind.CRASH, CRASHED)], seed=7)
    return run_simulation(cfg)


def test_every_round_commits_despite_a_crash(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    assert report["rounds_committed"] == ROUNDS, report
    assert all(r["contributors"] >= 2 for r in report["rounds"]), report["rounds"]


def test_every_survivor_holds_every_committed_result(run: tuple[Simulation, dict[str, Any]]) -> None:
    """No accepted update is lost to the churn: each live node's ledger has every committed
    round, with the same results (same head) as every other live node's."""
    sim, _ = run
    heads = set()
    for node in sim.nodes:
        if node.index == CRASHED:
            continue
        driver = sim._driver(node)
        assert driver is not None and driver.committed >= ROUNDS, node.index
        heads.add(tuple(r.digest for r in driver.book.ledger.results[:ROUNDS]))
    assert len(heads) == 1
    # Every update a leader or root took from a node that stayed up is in its round's result.
    assert set(sim.sent) >= set(range(1, ROUNDS + 1)), sim.sent
    assert sim.lost_updates() == {}, sim.lost_updates()


def test_idle_upkeep_per_node_is_bounded(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    idle = report["idle_per_node_s"]
    assert 0 < idle["msgs"] <= IDLE_MSGS_PER_NODE_S, idle
    # What it is made of: liveness probes (libp2p ping) and requests, every write counted once.
    writes = report["idle_writes_by_protocol"]
    assert writes.get("/ipfs/ping/1.0.0", 0) > 0 and writes.get("/gpuflex/msg/1.0.0", 0) > 0, writes
    assert sum(writes.values()) <= IDLE_MSGS_PER_NODE_S, writes


def test_the_crashed_node_is_down_everywhere(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    assert report["crashed_undetected"] == [], report
    assert report["detection_s"][str(CRASHED)] <= DETECTION_S, report["detection_s"]



def test_the_nodes_deadline_clock_is_the_modelled_wall_clock(run: tuple[Simulation, dict[str, Any]]) -> None:
    """A plan's deadlines cross the wire as wall-clock times. Read off the real clock, they
    shrank by the real seconds a plan was in flight, many per modelled second in a large
    simulation, and leaders got plans whose reduce deadline had already passed. Every node's
    deadline clock moves with modelled time instead: 100 modelled seconds are 100 seconds."""
    import trio
    import trio.testing

    sim, _ = run
    clocks = [n.jobs.clock for n in sim.nodes if n.jobs is not None]
    assert len(clocks) == len(sim.nodes)

    async def modelled_seconds() -> list[float]:
        before = [c.wall() for c in clocks]
        await trio.sleep(100.0)  # the mock clock jumps: no real time passes
        return [c.wall() - b for c, b in zip(clocks, before, strict=True)]

    moved = trio.run(modelled_seconds, clock=trio.testing.MockClock(autojump_threshold=0))
    assert all(abs(m - 100.0) < 1e-6 for m in moved), moved
