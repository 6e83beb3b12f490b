"""What a node takes a peer's reachability to be (``MeshNode.claimed_reachability``): the
peer's latest presence first, then its NodeInfo. A coordinator that held no NodeInfo of a home
member took it for reachable and made it a leader; at 100 simulated nodes, 10 % public, six of
ninety home members were placed so, and public members below them fetched the 10 MB model
through a home uplink (a 60 s round against a 15 s bound)."""

from __future__ import annotations

from mesh import node as mesh_node
from mesh.identity import Identity
from mesh.node import MeshConfig, MeshNode
from mesh.reachability import Reachability
from mesh.testing.simnet import SimNetwork

PEER = Identity(bytes(range(5, 37))).peer_id


def fresh_node() -> MeshNode:
    return MeshNode(Identity(bytes(range(32))), MeshConfig(transport=SimNetwork(0)))


def test_presence_says_what_a_missing_nodeinfo_cannot() -> None:
    node = fresh_node()
    assert node.claimed_reachability(PEER) == Reachability.UNKNOWN
    node.note_reachability(PEER, Reachability.RELAYED)
    assert node.claimed_reachability(PEER) == Reachability.RELAYED


def test_the_latest_presence_outranks_an_older_nodeinfo() -> None:
    node = fresh_node()
    rec = node.peers.add(PEER, [])
    rec.info = {"reachability": "private"}  # read before the peer held a relay slot
    assert node.claimed_reachability(PEER) == Reachability.PRIVATE
    node.note_reachability(PEER, Reachability.RELAYED)
    assert node.claimed_reachability(PEER) == Reachability.RELAYED
    node.note_reachability(PEER, None)  # a presence that does not say keeps the last word
    node.note_reachability(PEER, Reachability.UNKNOWN)
    assert node.claimed_reachability(PEER) == Reachability.RELAYED


def test_what_presence_said_is_bounded_and_never_about_this_node(monkeypatch) -> None:
    monkeypatch.setattr(mesh_node, "SAID_REACH_PEERS", 3)
    node = fresh_node()
    node.note_reachability(node.peer_id, Reachability.PUBLIC)
    peers = [Identity(bytes([i]) * 32).peer_id for i in range(1, 6)]
    for p in peers:
        node.note_reachability(p, Reachability.PRIVATE)
    assert list(node.said_reach) == peers[-3:] and node.peer_id not in node.said_reach
