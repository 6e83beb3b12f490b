"""What a stopping node still sends (``MeshNode.finishing``), under trio's MockClock.

A frame going out survives its caller's cancellation (the root's last result ends the job that
sent it), but not the node's stop by more than ``STOP_GRACE_S``. Before, a node told to stop
waited for such sends until their own timeouts: 5 s for an offer to a peer that was stopping
too, and a test mesh's teardown killed it after its grace."""

from __future__ import annotations

import math
from typing import Any

import trio

from mesh.codec import register_kind, seal
from mesh.identity import Identity
from mesh.messaging import Inbound
from mesh.node import STOP_GRACE_S, MeshConfig, MeshNode
from mesh.testing.simnet import SimNetwork

KIND = "stop_test"
register_kind(KIND)


def node() -> MeshNode:
    return MeshNode(Identity(bytes(range(32))), MeshConfig(transport=SimNetwork(0)))


async def test_a_send_outlives_its_callers_cancellation_while_the_node_runs(autojump_clock) -> None:
    n, start = node(), trio.current_time()
    done: list[float] = []
    with trio.move_on_after(1):  # the caller gives up after 1 s; the send takes 30
        with n.finishing() as scope:
            await trio.sleep(30)
            done.append(trio.current_time() - start)
    assert done == [30] and not scope.cancelled_caught


async def test_once_the_node_stops_a_send_has_the_grace_left_and_a_new_one_no_more(autojump_clock) -> None:
    n, start = node(), trio.current_time()
    ended: dict[str, tuple[float, bool]] = {}

    async def send(name: str) -> None:
        with n.finishing() as scope:
            await trio.sleep(math.inf)
        ended[name] = (trio.current_time() - start, scope.cancelled_caught)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send, "before")
        await trio.sleep(10)
        n.stop()
        nursery.cancel_scope.cancel()  # what the runtime does next: shielded, it runs on
        with trio.CancelScope(shield=True):
            await trio.sleep(0.5)
            nursery.start_soon(send, "after")
    assert ended == {"before": (10 + STOP_GRACE_S, True), "after": (10.5 + STOP_GRACE_S, True)}


async def test_a_broadcast_whose_pushes_hang_returns_at_the_grace_after_stop(autojump_clock) -> None:
    n = node()
    heard: list[str] = []

    async def handler(msg: Inbound) -> None:
        heard.append(msg.envelope.kind)

    async def forward(*args: Any, **kwargs: Any) -> int:  # a peer that never answers an offer
        await trio.sleep(math.inf)
        return 1

    n.handlers.register(KIND, handler)
    n.gossip.forward = forward  # type: ignore[method-assign]
    sent: list[Any] = []

    async def broadcast() -> None:
        sent.append(await n.broadcast(seal(n.identity, KIND, {})))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(broadcast)
        await trio.sleep(3)
        nursery.cancel_scope.cancel()  # the caller is cancelled: the pushes go on
        with trio.CancelScope(shield=True):
            await trio.sleep(3)
            assert sent == []
            n.stop()
            stopped = trio.current_time()
    assert heard == [KIND] and sent == [0]
    assert trio.current_time() == stopped + STOP_GRACE_S
