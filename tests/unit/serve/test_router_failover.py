"""A request whose server dies before answering is not lost when the survivors are only full:
it waits for room there (bounded), then is answered; if room never comes it is refused as busy
(429), not as a failure. A stream that a live, loaded server could not take is busy, not a
failure; one to a server that is gone is a failure. The servers are stand-ins (this tests the
router's rules, not the mesh)."""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from typing import Any

import pytest
import trio

from gpuflex.serve import Overloaded, ServeError
from gpuflex.serve.directory import IN_FLIGHT_PER_PEER, Directory
from gpuflex.serve.request import GenRequest
from gpuflex.serve.router import FAILOVER_WAIT_S, PROOF_S, Router
from mesh.messaging import SendError
from mesh.streaming import StreamBroken

HASH = "ab" * 16


class Servers:
    """``dead`` fails before any text; every other peer answers "ok"."""

    def __init__(self, dead: str) -> None:
        self.dead = dead
        self.asked: list[str] = []

    async def remote(self, peer: str, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
        self.asked.append(peer)
        if peer == self.dead:
            raise SendError(f"peer {peer}: connection reset")
        yield {"text": "ok", "n": 1}
        yield {"finish": "length", "usage": {}}

    def rtts(self) -> dict[str, float | None]:
        return {"dead": 1.0, "full": 1.0}

    def penalise(self, peer: str) -> None:
        pass

    def connected(self, peer: str) -> bool:
        return peer != self.dead


async def local(req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
    raise AssertionError("this node serves nothing")
    yield {}


def mesh_of_two() -> tuple[Directory, Servers, Router]:
    d = Directory("me")
    d.update("dead", {"m": HASH}, 3, 0)
    d.update("full", {"m": HASH}, 3, 3)
    d.servers["full"].sent = IN_FLIGHT_PER_PEER  # as many of this node's requests as it takes
    servers = Servers("dead")
    return d, servers, Router("me", d, local, servers)


async def answer(router: Router) -> str:
    text = ""
    async for item in router.generate(GenRequest("m", "p", 4, 0.0)):
        text += item.get("text", "")
    return text


async def test_a_request_whose_server_died_waits_for_room_at_a_full_survivor(autojump_clock: Any) -> None:
    d, servers, router = mesh_of_two()

    async def free_a_place() -> None:
        await trio.sleep(2.0)
        d.servers["full"].sent -= 1  # one of the survivor's requests ends
        d.update("full", {"m": HASH}, 3, 2)  # and it still announces itself

    async with trio.open_nursery() as nursery:
        nursery.start_soon(free_a_place)
        started = trio.current_time()
        assert await answer(router) == "ok"
        assert 2.0 <= trio.current_time() - started < 3.0
    assert servers.asked == ["dead", "full"]


async def test_a_survivor_that_stays_full_gets_the_request_refused_as_busy(autojump_clock: Any) -> None:
    d, servers, router = mesh_of_two()

    async def keep_announcing() -> None:
        while True:
            d.update("full", {"m": HASH}, 3, 3)
            await trio.sleep(1.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_announcing)
        started = trio.current_time()
        with pytest.raises(Overloaded, match="failed before answering and every other stayed busy"):
            await answer(router)
        assert trio.current_time() - started == pytest.approx(FAILOVER_WAIT_S, abs=0.5)
        nursery.cancel_scope.cancel()
    assert servers.asked == ["dead"]


async def test_a_fresh_request_is_still_refused_at_once_when_every_server_is_full(autojump_clock: Any) -> None:
    d, servers, router = mesh_of_two()
    d.servers["dead"].sent = IN_FLIGHT_PER_PEER  # nobody failed: plain backpressure, no waiting
    started = trio.current_time()
    with pytest.raises(Overloaded, match="as many of this node's requests"):
        await answer(router)
    assert trio.current_time() == started and servers.asked == []


class Refusing(Servers):
    """Every peer in ``resets`` resets the stream before its first item (as a peer at its stream
    limit does); ``queue_full`` answers its queue-full error; others answer "ok"."""

    def __init__(self, resets: set[str], gone: frozenset[str] | set[str] = frozenset(), queue_full: str = "") -> None:
        super().__init__(dead="")
        self.resets, self.gone, self.queue_full = resets, gone, queue_full

    async def remote(self, peer: str, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
        self.asked.append(peer)
        if peer in self.resets:
            raise StreamBroken(f"the stream from peer {peer} broke: StreamReset", 0)
        if peer == self.queue_full:
            yield {"error": "model 'm' has 4 requests waiting; try again shortly", "status": 429}
        yield {"text": "ok", "n": 1}
        yield {"finish": "length", "usage": {}}

    def connected(self, peer: str) -> bool:
        return peer not in self.gone


async def announcing(d: Directory, loads: dict[str, int], every: float = 0.2) -> None:
    """The servers' announcements: each alive and at ``loads[peer]`` of its batch of 3."""
    while True:
        for peer, load in loads.items():
            d.update(peer, {"m": HASH}, 3, load)
        await trio.sleep(every)


@pytest.mark.parametrize(("connected", "talking", "load", "busy"), [
    (True, True, 3, True),     # alive (still connected, still announcing) with a full batch: busy
    (False, True, 3, False),   # its connection closed: it is gone, whatever it said last
    (True, False, 3, False),   # silent since the failure: not taken for alive
    (True, True, 1, False),    # alive but with room: a reset is no sign of load, so a failure
])
async def test_a_stream_a_server_could_not_take_is_busy_only_when_it_is_alive_and_loaded(
        autojump_clock: Any, connected: bool, talking: bool, load: int, busy: bool) -> None:
    d = Directory("me")
    d.update("a", {"m": HASH}, 3, load)
    servers = Refusing({"a"}, gone=set() if connected else {"a"})
    router = Router("me", d, local, servers)
    async with trio.open_nursery() as nursery:
        if talking:
            nursery.start_soon(announcing, d, {"a": load})
        started = trio.current_time()
        if busy:
            with pytest.raises(Overloaded, match="every server of 'm' is busy"):
                await answer(router)
        else:
            with pytest.raises(ServeError, match="failed before answering") as caught:
                await answer(router)
            assert caught.value.status == 503
        assert trio.current_time() - started <= PROOF_S + 0.2  # proof of life is waited for briefly
        nursery.cancel_scope.cancel()
    assert (d.servers["a"].failed_at == -math.inf) is busy  # a failed server is left out for a while
    assert servers.asked == ["a"] and d.servers["a"].sent == 0


async def test_a_busy_server_s_request_goes_to_the_next_and_a_dead_one_is_left_out(autojump_clock: Any) -> None:
    d = Directory("me")
    for peer, load in (("busy", 3), ("dead", 0), ("ok", 3)):
        d.update(peer, {"m": HASH}, 3, load)
    servers = Refusing({"busy", "dead"}, gone={"dead"})
    router = Router("me", d, local, servers)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(announcing, d, {"busy": 3, "ok": 3})
        assert await answer(router) == "ok"
        nursery.cancel_scope.cancel()
    assert servers.asked == ["dead", "busy", "ok"]  # by load, then name
    assert d.servers["busy"].failed_at == -math.inf and d.servers["dead"].failed_at > -math.inf


async def test_a_request_every_server_refused_as_busy_is_refused_at_once_not_held(autojump_clock: Any) -> None:
    """Waiting for room is for the requests of a server that failed: a request that a server
    refused as busy, with the other server at as many of this node's requests as it takes, is
    answered 429 at once (a flood gets its 429s, not a hidden queue of 30 s)."""
    d = Directory("me")
    d.update("q", {"m": HASH}, 3, 3)
    d.update("full", {"m": HASH}, 3, 3)
    d.servers["full"].sent = IN_FLIGHT_PER_PEER
    servers = Refusing(set(), queue_full="q")
    router = Router("me", d, local, servers)
    started = trio.current_time()
    with pytest.raises(Overloaded, match="every server of 'm' is busy"):
        await answer(router)
    assert trio.current_time() == started and servers.asked == ["q"]


async def test_requests_arriving_together_are_counted_before_any_await_and_spread(autojump_clock: Any) -> None:
    """A request is counted against its server before the router awaits anything (here the
    caller's ``on_server``, which yields): the next request, chosen meanwhile, sees it."""
    d = Directory("me")
    d.update("a", {"m": HASH}, 3, 0)
    d.update("b", {"m": HASH}, 3, 0)
    servers = Refusing(set())
    router = Router("me", d, local, servers)
    chosen: list[str] = []

    async def note(peer: str) -> None:
        chosen.append(peer)
        await trio.sleep(0)

    async def one() -> None:
        async for _ in router.generate(GenRequest("m", "p", 4, 0.0), on_server=note):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
    assert sorted(chosen) == ["a", "b"]
