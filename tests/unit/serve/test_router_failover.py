"""A request whose server dies before answering is not lost when the survivors are only full:
it waits for room there (bounded), then is answered; if room never comes it is refused as busy
(429), not as a failure. The servers are stand-ins (this tests the router's rules, not the mesh)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest
import trio

from gpuflex.serve import Overloaded
from gpuflex.serve.directory import IN_FLIGHT_PER_PEER, Directory
from gpuflex.serve.request import GenRequest
from gpuflex.serve.router import FAILOVER_WAIT_S, Router
from mesh.messaging import SendError

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
