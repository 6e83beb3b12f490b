"""What a coordinator knows of its members' reachability, from records and from presence.

A large mesh's peer table holds a bounded few records, so most members' reachability is known
from their presence alone (``MeshNode.note_reachability``). The plan's private list, the
hole-punched homes that may lead, and the members of unknown reachability (listed as private,
leading last) must read both: at 100 simulated nodes, nine in ten at home, a coordinator that
read records alone took homes for reachable and made them leaders nobody could dial.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from gpuflex.node.nodeport import NodePort
from mesh.health import PeerTable
from mesh.identity import Identity
from mesh.node import MeshNode
from mesh.reachability import Reachability


def _port(tmp_path: Path, me: str, table: PeerTable) -> tuple[NodePort, Any]:
    mesh = SimpleNamespace(peer_id=me, peers=table, said_reach=OrderedDict(),
                           nat=SimpleNamespace(reachability=lambda: Reachability.PUBLIC))
    mesh.claimed_reachability = lambda peer: MeshNode.claimed_reachability(cast(Any, mesh), peer)
    return NodePort(cast(Any, mesh), cast(Any, None), tmp_path, "job", cast(Any, None)), mesh


def test_presence_claims_count_for_peers_the_table_holds_no_record_of(tmp_path: Path) -> None:
    me, recorded, home, punched, public, silent = (Identity(bytes([i]) * 32).peer_id for i in range(1, 7))
    table = PeerTable()
    table.add(recorded, ["/ip4/10.0.0.2/tcp/1"])
    table.get(recorded).info = {"reachability": "private"}
    port, mesh = _port(tmp_path, me, table)
    for peer, claim in ((home, Reachability.PRIVATE), (punched, Reachability.RELAYED), (public, Reachability.PUBLIC)):
        MeshNode.note_reachability(cast(Any, mesh), peer, claim)
    assert port.private_peers() == {recorded, home, punched}
    assert port.punched_peers() == {punched}
    everyone = [me, recorded, home, punched, public, silent]
    assert port.reach_unknown(everyone) == {silent}  # this node aside: it knows its own
    MeshNode.note_reachability(cast(Any, mesh), silent, Reachability.PUBLIC)
    assert port.reach_unknown(everyone) == set() and port.behind_nat(silent) is False
