"""The relay service's reservation rules (``mesh.hopguard``), on py-libp2p's own resource manager.

The per-network cap cannot be seen on loopback (loopback has no network prefix), so it is
checked here with addresses given per peer; ``tests/integration/test_hostile_relay.py`` runs the
rest against a real node."""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.hopguard import HopGuard
from mesh.identity import Identity
from mesh.relay import RelayLimitsConfig


def guard(addresses: dict[Any, str], members: set[str] | None = None, **limits: Any) -> HopGuard:
    from libp2p.relay.circuit_v2.resources import RelayResourceManager

    config = RelayLimitsConfig(**limits)
    protocol = SimpleNamespace(host=None, resource_manager=RelayResourceManager(config.libp2p_limits()),
                               _handle_reserve=None, _handle_connect=None, _relay_data=None)
    hop = HopGuard(protocol, config, None if members is None else members.__contains__)
    hop._ip = addresses.get  # type: ignore[method-assign]
    return hop


def peer() -> Any:
    from libp2p.peer.id import ID

    return ID.from_base58(Identity.generate().peer_id)


@cache
def pool() -> list[Any]:
    return [peer() for _ in range(40)]


@settings(deadline=None, max_examples=60)
@given(st.lists(st.sampled_from(["203.0.113.", "198.51.100.", "127.0.0."]), min_size=1, max_size=40),
       st.integers(1, 6))
def test_at_most_the_cap_of_reservations_per_network_and_loopback_is_exempt(nets: list[str], cap: int) -> None:
    peers = pool()[: len(nets)]
    addresses = {p: f"{net}{i % 250 + 1}" for i, (p, net) in enumerate(zip(peers, nets, strict=True))}
    hop = guard(addresses, max_reservations_per_network=cap)
    rm = hop.protocol.resource_manager
    granted: dict[str, int] = {}
    for p, net in zip(peers, nets, strict=True):
        if hop.reserve_refusal(p) is None:
            rm.reserve(p)
            granted[net] = granted.get(net, 0) + 1
    for net in ("203.0.113.", "198.51.100."):
        assert granted.get(net, 0) == min(cap, nets.count(net))
    assert granted.get("127.0.0.", 0) == nets.count("127.0.0.")
    assert all(hop.reserve_refusal(p) is None for p in rm._reservations)  # holders may renew


def test_only_peers_of_the_mesh_get_a_reservation_unless_the_operator_says_any() -> None:
    member, stranger = peer(), peer()
    addresses = {member: "203.0.113.1", stranger: "203.0.113.2"}
    hop = guard(addresses, members={member.to_base58()})
    assert hop.reserve_refusal(member) is None
    assert hop.reserve_refusal(stranger) == "not a peer of this mesh"
    assert guard(addresses, members={member.to_base58()}, carry_any=True).reserve_refusal(stranger) is None


def test_the_reservation_lifetime_is_bounded() -> None:
    import pytest

    assert RelayLimitsConfig().libp2p_limits().reservation_ttl == 900
    with pytest.raises(ValueError):
        RelayLimitsConfig(reservation_ttl_s=86400)
