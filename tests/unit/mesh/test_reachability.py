"""Reachability verdicts, dial-back targets, peer exchange and relay limits: pure logic."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.codec import seal
from mesh.health import PeerTable
from mesh.identity import Identity
from mesh.lan import worth_announcing
from mesh.pex import MAX_PEERS, PeerExchange
from mesh.reachability import (
    MAX_CLAIMED,
    Reachability,
    ReachabilityState,
    dial_targets,
    explain,
    is_lan_ip,
    listen_ports,
    on_my_lan,
)
from mesh.relay import RelayLimitsConfig

ALICE = Identity(bytes(range(32)))
BOB = Identity(bytes(range(1, 33)))


def test_verdict_from_answers() -> None:
    state = ReachabilityState()
    assert state.verdict(now=100) == Reachability.UNKNOWN
    state.record("s1", False, now=100)
    assert state.verdict(now=100) == Reachability.PRIVATE
    assert state.verdict(has_reservation=True, now=100) == Reachability.RELAYED
    state.record("s2", True, "/ip4/198.51.100.10/tcp/4001", now=101)
    assert state.verdict(now=101) == Reachability.PUBLIC
    assert state.reached_at() == ["/ip4/198.51.100.10/tcp/4001"]
    assert state.verdict(now=101 + 10_000) == Reachability.UNKNOWN  # answers go stale
    state.forced = Reachability.PRIVATE
    assert state.verdict(now=101) == Reachability.PRIVATE


def test_dial_targets_only_on_the_observed_ip_and_bounded() -> None:
    body = {"ports": [4001, 0, 70000, "x", 4002], "addrs": ["/ip4/203.0.113.9/tcp/5000", "/ip4/198.51.100.21/tcp/6000",
                                                             "/dns4/evil.example/tcp/1", 42]}
    targets = dial_targets(body, ["198.51.100.21"])
    assert targets == ["/ip4/198.51.100.21/tcp/4001", "/ip4/198.51.100.21/tcp/4002", "/ip4/198.51.100.21/tcp/6000"]
    assert dial_targets(body, []) == [] and dial_targets("garbage", ["1.2.3.4"]) == []


@given(st.dictionaries(st.sampled_from(["ports", "addrs", "x"]),
                       st.lists(st.one_of(st.integers(), st.text(max_size=300), st.binary(max_size=20)), max_size=50)))
def test_dial_targets_never_leave_the_observed_ip(body: dict[str, Any]) -> None:
    targets = dial_targets(body, ["192.0.2.7"])
    assert len(targets) <= MAX_CLAIMED
    assert all(t.startswith("/ip4/192.0.2.7/tcp/") for t in targets)


def test_lan_addresses() -> None:
    import ipaddress

    nets = [ipaddress.ip_network("192.168.1.0/24")]
    assert is_lan_ip("192.168.1.3") and is_lan_ip("10.1.2.3") and not is_lan_ip("198.51.100.10")
    assert on_my_lan("192.168.1.3", nets) and not on_my_lan("192.168.2.3", nets)
    addrs = ["/ip4/0.0.0.0/tcp/4001", "/ip4/1.2.3.4/tcp/9/p2p/x/p2p-circuit/p2p/y", "/ip4/1.2.3.4/udp/5"]
    assert listen_ports(addrs) == [4001]
    assert worth_announcing(["/ip4/0.0.0.0/tcp/4001"]) and not worth_announcing(["/ip4/127.0.0.1/tcp/0"])


@pytest.mark.parametrize(("info", "state", "connected", "words"), [
    (None, "down", False, "no NodeInfo"),
    ({"reachability": "private", "addrs": []}, "down", False, "behind NAT, no relay reservation"),
    ({"reachability": "relayed", "addrs": ["/ip4/1.2.3.4/tcp/1/p2p/R/p2p-circuit/p2p/X"]}, "down", False,
     "relays could not connect"),
    ({"reachability": "public", "addrs": []}, "down", False, "stopped answering"),
    ({"reachability": "public", "addrs": []}, "suspect", True, "slow to answer"),
    ({"reachability": "public", "addrs": []}, "up", True, ""),
])
def test_explain(info: dict[str, Any] | None, state: str, connected: bool, words: str) -> None:
    text = explain(info, state, connected)
    assert words in text if words else text == ""


def _node(identity: Identity) -> Any:
    return SimpleNamespace(peer_id=identity.peer_id, identity=identity, peers=PeerTable())


def test_peer_exchange_takes_only_records_signed_by_their_peer() -> None:
    learnt: dict[str, dict[str, Any]] = {}
    node = _node(ALICE)

    def on_info(peer: str, info: dict[str, Any]) -> None:  # as MeshNode._learn_info does
        node.peers.add(peer).info = info
        learnt[peer] = info

    pex = PeerExchange(node, on_info)
    good = seal(BOB, "nodeinfo", {"peer_id": BOB.peer_id, "addrs": ["/ip4/1.2.3.4/tcp/1"], "ts": 1.0})
    forged = seal(ALICE, "nodeinfo", {"peer_id": BOB.peer_id, "addrs": []})  # Alice speaking for Bob
    own = seal(ALICE, "nodeinfo", {"peer_id": ALICE.peer_id, "addrs": []})
    assert pex.learn([forged, b"junk", 7, own, good], "src") == 1
    assert list(learnt) == [BOB.peer_id] and learnt[BOB.peer_id]["addrs"] == ["/ip4/1.2.3.4/tcp/1"]
    assert pex.learn("not a list", "src") == 0
    assert pex.learn([good] * (MAX_PEERS + 10), "src") == 0  # nothing new; and bounded


def test_relay_limits_are_checked() -> None:
    limits = RelayLimitsConfig(max_circuit_bytes=5 << 20, max_circuit_duration_s=60, max_circuits=2)
    lib = limits.libp2p_limits()
    assert (lib.data, lib.duration, lib.max_circuit_conns, lib.max_reservations) == (5 << 20, 60, 2, 32)
    with pytest.raises(ValueError):
        RelayLimitsConfig(max_circuits=-1)
    with pytest.raises(ValueError):
        RelayLimitsConfig(reservations=9)
