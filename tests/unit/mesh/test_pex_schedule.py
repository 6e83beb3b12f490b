"""Peer exchange's ask schedule under trio's MockClock: fast while asks teach something or the
peer table changes, backing off once a young node's asks teach nothing (a settled small mesh
asked every 2 s for its first half minute, for nothing)."""

from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from mesh.codec import seal
from mesh.health import PeerState, PeerTable, protocol_clock
from mesh.identity import Identity
from mesh.pex import FAST_S, QUIET_ASKS, SLOW_S, YOUNG_S, PeerExchange, young_gap

ME = Identity(bytes(range(32)))
SOURCE = Identity(bytes(range(1, 33)))
NEWCOMER = Identity(bytes(range(2, 34)))
NEWCOMER_INFO = seal(NEWCOMER, "nodeinfo", {"peer_id": NEWCOMER.peer_id, "addrs": ["/ip4/10.0.0.9/tcp/1"], "ts": 1.0})


class Host(SimpleNamespace):
    """A node whose one up peer answers every ask with ``answer``; each ask's time is kept."""

    async def request(self, peer: str, frame: bytes, payload: Any = None, timeout: float = 30.0) -> Any:
        self.asks.append(trio.current_time())
        return list(self.answer)

    def connected_ids(self) -> set[str]:
        return set(self.connected)


def host() -> Host:
    return Host(peer_id=ME.peer_id, identity=ME, peers=PeerTable(clock=protocol_clock), asks=[], answer=[],
                connected=[])


def test_the_young_gap_stays_fast_for_a_few_quiet_asks_then_doubles_to_the_slow_period() -> None:
    gaps = [young_gap(quiet) for quiet in range(9)]
    assert QUIET_ASKS == 3 and gaps == [2.0, 2.0, 2.0, 4.0, 8.0, 16.0, 20.0, 20.0, 20.0] and SLOW_S == 20.0
    assert young_gap(0) == FAST_S


def run_for(node: Host, seconds: float, during: Any = None, every_s: float = SLOW_S) -> None:
    async def main() -> None:
        node.peers.reached(node.peers.add(SOURCE.peer_id).peer_id)
        pex = PeerExchange(node, lambda peer, info: node.peers.add(peer).__setattr__("info", info), every_s=every_s)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pex.run)
            if during is not None:
                await during()
            await trio.sleep_until(seconds)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_settled_young_node_backs_off_then_asks_at_the_slow_period() -> None:
    node = host()
    run_for(node, YOUNG_S + 2 * SLOW_S + 1)
    young = [t for t in node.asks if t < YOUNG_S]
    # The first ask (news: the table was new to it), three quiet ones at FAST_S, then 4, 8, 16.
    assert young == [0.0, 2.0, 4.0, 6.0, 10.0, 18.0], node.asks
    after = [t for t in node.asks if t >= YOUNG_S]
    assert after[0] == 34.0 and [b - a for a, b in pairwise(after)] == [SLOW_S] * (len(after) - 1), node.asks
    assert len(young) <= YOUNG_S / FAST_S / 2  # was one ask every FAST_S: 15


def test_the_operator_s_period_paces_a_settled_node_and_caps_a_young_one_s_back_off() -> None:
    node = host()
    run_for(node, YOUNG_S + 20.0 + 1, every_s=5.0)
    young = [t for t in node.asks if t < YOUNG_S]
    # Three quiet asks at FAST_S, then 4, then the back-off stops at the chosen 5 s.
    assert young[:6] == [0.0, 2.0, 4.0, 6.0, 10.0, 15.0], node.asks
    assert all(b - a <= 5.0 for a, b in pairwise(node.asks)), node.asks
    after = [t for t in node.asks if t >= YOUNG_S]
    assert len(after) >= 4 and [b - a for a, b in pairwise(after)] == [5.0] * (len(after) - 1), node.asks


def test_a_period_outside_its_bounds_is_refused() -> None:
    for bad in (0.0, 0.5, 7200.0, float("nan")):
        with pytest.raises(ValueError, match="peer-exchange period"):
            PeerExchange(host(), lambda peer, info: None, every_s=bad)


def test_an_ask_that_teaches_a_peer_keeps_the_pace_fast() -> None:
    node = host()

    async def newcomer_arrives() -> None:
        await trio.sleep(13.0)  # the source hears of a new node while this one has backed off
        node.answer = [NEWCOMER_INFO]

    run_for(node, 25.0, during=newcomer_arrives)
    # Backed off after 10.0; the ask at 18.0 teaches the newcomer, so the next is FAST_S later.
    assert node.asks[:7] == [0.0, 2.0, 4.0, 6.0, 10.0, 18.0, 20.0], node.asks
    assert NEWCOMER.peer_id in node.peers


def test_a_node_whose_only_peer_is_down_here_still_asks_it_while_connected() -> None:
    node = host()
    node.connected = [SOURCE.peer_id]
    node.answer = [NEWCOMER_INFO]

    async def source_held_down() -> None:
        node.peers.set_state(SOURCE.peer_id, PeerState.DOWN)  # it answered this node's probes too late

    run_for(node, 5.0, during=source_held_down)
    assert node.asks and NEWCOMER.peer_id in node.peers


def test_a_node_with_no_peer_up_nor_connected_asks_no_one() -> None:
    node = host()

    async def source_gone() -> None:
        node.peers.set_state(SOURCE.peer_id, PeerState.DOWN)

    run_for(node, 5.0, during=source_gone)
    assert node.asks == []  # held down before its first ask, and not connected
