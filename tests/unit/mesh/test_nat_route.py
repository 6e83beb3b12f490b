"""Routes to private peers (``mesh.nat.NatService.route``): a peer whose NodeInfo here says
it is behind NAT with no relay is looked up afresh before a stream to it is refused, and reached
through the circuit it announces now; the look-up is paced per peer, so a peer that really is
unreachable costs one DHT read per ``RECHECK_PRIVATE_S``, not one per message."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from mesh import nat
from mesh.health import PeerRecord
from mesh.messaging import SendError
from mesh.nat import NatHost, NatService

PEER = "12D3KooWPeerBehindNat"
CIRCUIT = f"/ip4/198.51.100.7/tcp/4001/p2p/12D3KooWRelay/p2p-circuit/p2p/{PEER}"
STALE = {"reachability": "private", "addrs": ["/ip4/10.0.0.5/tcp/4001"]}
FRESH = {"reachability": "relayed", "addrs": ["/ip4/10.0.0.5/tcp/4001", CIRCUIT]}


class Relay:
    def __init__(self) -> None:
        self.dialled: list[list[str]] = []

    def connected(self, peer: str) -> bool:
        return False

    async def connect(self, peer: str, circuits: list[str], timeout: float) -> None:
        self.dialled.append(circuits)


class Host:
    """What ``route`` reads of its node: the peer's record, and the DHT's copy of its NodeInfo."""

    def __init__(self, published: dict[str, Any] | None) -> None:
        self.record = PeerRecord(PEER, first_seen=0.0, info=dict(STALE))
        self.published, self.lookups = published, 0
        self.peers = SimpleNamespace(get=lambda peer: self.record if peer == PEER else None)
        self.config = SimpleNamespace(reachability=None, client_mode=False)

    async def lookup_node_info(self, peer: str, timeout: float = 2.5) -> dict[str, Any] | None:
        self.lookups += 1
        return self.published


def service(host: Host) -> tuple[NatService, Relay]:
    svc = NatService(cast(NatHost, host))
    svc.relay = cast(Any, Relay())
    svc._lan_nets = []
    return svc, cast(Relay, svc.relay)


async def test_a_private_record_is_looked_up_afresh_and_the_announced_circuit_dialled() -> None:
    host = Host(published=FRESH)
    svc, relay = service(host)
    await svc.route(PEER, timeout=5.0)
    assert relay.dialled == [[CIRCUIT]] and host.lookups == 1
    assert host.record.info == FRESH  # kept: the next stream routes by it without a look-up
    await svc.route(PEER, timeout=5.0)
    assert relay.dialled == [[CIRCUIT], [CIRCUIT]] and host.lookups == 1


async def test_a_peer_still_private_is_refused_and_looked_up_again_only_after_the_pause(
        autojump_clock: trio.testing.MockClock) -> None:
    host = Host(published=dict(STALE))
    svc, relay = service(host)
    for _ in range(3):
        with pytest.raises(SendError, match="behind NAT, no relay reservation"):
            await svc.route(PEER, timeout=5.0)
    assert host.lookups == 1 and relay.dialled == []
    await trio.sleep(nat.RECHECK_PRIVATE_S)
    with pytest.raises(SendError):
        await svc.route(PEER, timeout=5.0)
    assert host.lookups == 2
