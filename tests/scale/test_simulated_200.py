"""Two hundred nodes of the production mesh and round code on the simulator's modelled network.

Each node is a real MeshNode and JobManager (``gpuflex.testing.sim``); only the sockets and the
trainer are stand-ins, and trio's MockClock runs modelled time. Half of the nodes are behind
NAT (half of those hole-punchable). A churn trace crashes the first leader seen holding a
member's update, then kills one node and crashes another during the rounds.

It costs three to four CPU-minutes, more than the five-minute suite can give on two cores, so
it is marked ``scale``: ``just test`` leaves it out, ``just test-scale`` runs it, and CI runs both.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpuflex.testing.sim import ChurnEvent, ChurnKind, SimConfig, Simulation, run_simulation

pytestmark = [pytest.mark.scale, pytest.mark.timeout(900)]

NODES = 200
ROUNDS = 3
KILLED, CRASHED = NODES - 1, NODES - 2
#: Idle upkeep per node, bounded whatever the mesh size (the 16-node figure is about 9).
IDLE_MSGS_PER_NODE_S = 15.0
#: Connections a node holds when idle: the overlay, the DHT's nearest, relays; not the mesh.
CONNECTIONS_PER_NODE = 100
#: A killed node (its connections reset at once) is ``down`` for every peer that knew it
#: within this long.
KILL_DETECTION_S = 10.0
#: A node gone silent keeps its connections open on the other side: a peer whose connection
#: is open is slow, not gone, until silent for twice ``down_after_s`` (``mesh.liveness``'s
#: ``CONNECTED_SILENCE_FACTOR``, for loaded machines), so this takes longer.
SILENT_DETECTION_S = 40.0
#: Gossip's overlay degree: each node relays to D neighbours. Views of the membership differ
#: while a mesh settles, so links are not all mutual and a node may take up to 2 D copies.
D = 10


@pytest.fixture(scope="module")
def run() -> tuple[Simulation, dict[str, Any]]:
    logging.getLogger("mesh").setLevel(logging.ERROR)
    logging.getLogger("gpuflex").setLevel(logging.ERROR)
    churn = [ChurnEvent(0.0, ChurnKind.CRASH_LEADER, -1), ChurnEvent(12.0, ChurnKind.LEAVE, KILLED),
             ChurnEvent(16.0, ChurnKind.CRASH, CRASHED)]
    cfg = SimConfig(nodes=NODES, rounds=ROUNDS, public_fraction=0.5, group_size=8, compute_s=2.0,
                    settle_s=20.0, churn=churn, seed=11)
    return run_simulation(cfg)


def test_every_round_commits_with_nearly_every_member(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    assert report["rounds_committed"] == ROUNDS, report["rounds"]
    # All but the churned nodes, and a few a round's plan missed while they were suspected.
    assert all(r["contributors"] >= NODES - 3 - 10 for r in report["rounds"]), report["rounds"]
    assert all(r["max_children"] <= 8 for r in report["rounds"]), report["rounds"]


def test_a_crashed_leader_loses_no_update_it_had_taken(run: tuple[Simulation, dict[str, Any]]) -> None:
    sim, report = run
    crashed_leaders = [i for i in sim.crashed if i not in (KILLED, CRASHED)]
    assert len(crashed_leaders) == 1, sim.crashed
    leader = sim.nodes[crashed_leaders[0]].peer_id
    held = [nodes for takers in sim.takers.values() for peer, nodes in takers.items() if peer == leader]
    assert held and any(held), "the crashed leader had taken no update"
    assert report["lost_updates"] == {}, report["lost_updates"]


def test_idle_upkeep_per_node_is_bounded(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    idle = report["idle_per_node_s"]
    assert 0 < idle["msgs"] <= IDLE_MSGS_PER_NODE_S, idle
    conns = report["idle_connections_per_node"]
    assert conns["max"] <= CONNECTIONS_PER_NODE, conns


def test_churned_nodes_are_down_everywhere_in_time(run: tuple[Simulation, dict[str, Any]]) -> None:
    sim, report = run
    assert report["crashed_undetected"] == [], report
    assert set(report["detection_s"]) == {str(i) for i in sim.crashed}
    detection = report["detection_s"]
    assert detection[str(KILLED)] <= KILL_DETECTION_S, detection
    assert all(s <= SILENT_DETECTION_S for s in detection.values()), detection


def test_gossip_reaches_every_node_quickly_with_few_copies(run: tuple[Simulation, dict[str, Any]]) -> None:
    _, report = run
    gossip = report["gossip"]
    assert gossip["reached"] == 1.0 and gossip["t99_s"] <= 2.0, gossip
    assert gossip["mean_copies_per_node"] <= D and gossip["max_copies_per_node"] <= 2 * D, gossip
