"""The committed model's way down the tree: parent first, a parent that does not hold it yet
asked again, a failing one skipped, the root last (``gpuflex.node.downtree``)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation.tree import build_tree, fan_out
from gpuflex.node.collector import ancestors
from gpuflex.node.core.messages import Result
from gpuflex.node.core.placement import order_for_tree
from gpuflex.node.downtree import WAIT_S, down_chain, fetch_down, first_sources
from gpuflex.node.port import JobPort
from mesh.blob import BlobError, BlobNotFound
from mesh.health import PeerState

DIGEST = "ab" * 32


class Port:
    """What ``fetch_down`` uses of a port: each peer holds the blob from ``ready_at`` (trio
    time) on, or fails every ask (``broken``); every ask is recorded."""

    def __init__(self, ready_at: dict[str, float], broken: set[str] = frozenset(),  # type: ignore[assignment]
                 down: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.ready_at, self.broken, self.down = ready_at, broken, down
        self.asks: list[str] = []
        self.held = False
        self.blobs = SimpleNamespace(has=lambda digest: self.held)

    async def fetch_blob(self, digest: str, providers: list[str], timeout: float, max_size: int) -> None:
        (peer,) = providers
        self.asks.append(peer)
        await trio.sleep(0.01)
        if peer in self.broken:
            raise BlobError(f"{peer}: unreachable")
        if trio.current_time() < self.ready_at.get(peer, float("inf")):
            raise BlobNotFound(f"{peer}: not found")
        self.held = True

    def health(self, peer: str) -> PeerState | None:
        return PeerState.DOWN if peer in self.down else PeerState.UP


def _port(port: Port) -> JobPort:
    return cast(JobPort, port)


def test_the_chain_is_the_parent_then_the_ancestors_and_the_root_last() -> None:
    members = [f"m{i:02d}" for i in range(64)]
    parent = build_tree(members, 8, "m00")
    res = cast(Result, SimpleNamespace(plan=SimpleNamespace(parent=parent, private=()), coordinator="m00"))
    leaf = next(m for m in members if m not in parent.values() and parent[m] != "m00")
    chain = down_chain(res, leaf)
    assert chain[0] == parent[leaf] and chain[-1] == "m00" and len(chain) >= 2
    assert down_chain(res, "m00") == []  # the root holds it
    assert down_chain(res, "stranger") == ["m00"]  # outside the plan: the coordinator


async def test_a_parent_that_does_not_hold_it_yet_is_asked_again_not_the_root(autojump_clock: Any) -> None:
    port = Port({"parent": 3.0, "root": 0.0})
    assert await fetch_down(_port(port), DIGEST, ["parent", "root"], timeout=5, max_size=1 << 20) == "parent"
    assert "root" not in port.asks and port.asks.count("parent") > 2


async def test_a_broken_or_down_parent_moves_on_at_once(autojump_clock: Any) -> None:
    port = Port({"grand": 0.0, "root": 0.0}, broken={"parent"})
    assert await fetch_down(_port(port), DIGEST, ["parent", "grand", "root"], timeout=5, max_size=1) == "grand"
    assert port.asks == ["parent", "grand"]
    port = Port({"root": 0.0}, down={"parent"})  # "not found" from a peer marked down: not waited for
    assert await fetch_down(_port(port), DIGEST, ["parent", "root"], timeout=5, max_size=1) == "root"
    assert port.asks == ["parent", "root"]


async def test_the_wait_is_bounded_then_the_root_serves(autojump_clock: Any) -> None:
    port = Port({"root": 0.0})  # the parent never gets it
    start = trio.current_time()
    assert await fetch_down(_port(port), DIGEST, ["parent", "grand", "root"], timeout=5, max_size=1) == "root"
    assert trio.current_time() - start <= WAIT_S + 1
    assert port.asks[-2:] == ["grand", "root"]  # past the wait, each one above is asked once


async def test_nobody_serving_it_is_an_error(autojump_clock: Any) -> None:
    port = Port({}, broken={"root"})
    with pytest.raises(BlobError, match="no tree ancestor"):
        await fetch_down(_port(port), DIGEST, ["parent", "root"], timeout=5, max_size=1, wait_s=2)


def test_the_children_of_a_leader_behind_nat_ask_a_public_node_first() -> None:
    parent = {"root": None, "home": "root", "pub": "root", "leaf": "home", "leaf2": "pub"}
    plan = SimpleNamespace(parent=parent, private=("home", "leaf"))
    res = cast(Result, SimpleNamespace(plan=plan, coordinator="root"))
    # "pub" (one copy to send so far) is nearer the root than "leaf" and less loaded than the root (two)
    assert first_sources(parent, plan.private)["leaf"] == "pub"
    assert down_chain(res, "leaf") == ["pub", "root", "home"]  # the home leader is the last fallback
    assert down_chain(res, "leaf2") == ["pub", "root"]
    everyone_home = SimpleNamespace(parent=parent, private=tuple(parent))
    assert down_chain(cast(Result, SimpleNamespace(plan=everyone_home, coordinator="root")), "leaf") == \
        ["home", "root"]


@settings(max_examples=150, deadline=None)
@given(n_public=st.integers(1, 40), n_home=st.integers(0, 300), group_size=st.integers(2, 12))
def test_home_leaders_children_are_spread_over_public_nodes_nearer_the_root(
        n_public: int, n_home: int, group_size: int) -> None:
    """Whatever the share of public members: a member's first source is its parent when that
    is public, else a public node nearer the root; no public node takes many more copies than
    its share of them."""
    public = [f"pub{i:02d}" for i in range(n_public)]
    home = {f"home{i:03d}" for i in range(n_home)}
    ordered, size = order_for_tree(public[0], [*public, *sorted(home)], home, group_size, punched=home)
    parent = build_tree(ordered, size, public[0])
    source = first_sources(parent, home)
    assert set(source) == set(parent) - {public[0]}
    hops = {m: len(ancestors(parent, m)) for m in parent}
    for m, q in source.items():
        assert q == parent[m] or (q not in home and parent[m] in home and hops[q] < hops[m]), (m, q)
    loads = Counter(source.values())
    under_home = sum(1 for m in source if parent[m] in home)
    most_public = max((loads[q] for q in public), default=0)
    assert most_public <= fan_out(size) + -(-under_home // n_public) + 1
    assert not any(q in home for q in loads)  # a public node nearer the root always exists


async def test_each_round_s_model_comes_down_the_tree_not_from_the_root(autojump_clock: Any, tmp_path: Any) -> None:
    """Thirteen members in groups of three (a tree three levels deep, at most two children a
    node), with blobs fetched only from the providers a node names, as the mesh does: every
    member holds each committed model, fetched from its own parent, and no node serves a
    round's model to more members than it has children."""
    from tests.unit.node.fakenet import FakeNet, fast_spec
    from tests.unit.node.test_round_protocol import one_ledger

    net = FakeNet(tmp_path, 13, fast_spec(rounds=2, group_size=3, min_nodes=13))
    net.providers_only = True
    async with trio.open_nursery() as nursery:
        await net.start(nursery)
        await net.wait_rounds(2)
        results = one_ledger(net, 2)
        nursery.cancel_scope.cancel()
    for res in results:
        parent = res.plan.parent
        fetches = [(server, fetcher) for digest, server, fetcher in net.served
                   if digest in {res.model_hash, res.step_hash}]
        assert {fetcher for _, fetcher in fetches} == set(parent) - {res.coordinator}
        assert all(parent[fetcher] == server for server, fetcher in fetches), fetches
        assert max(Counter(server for server, _ in fetches).values()) <= fan_out(3)
