"""Streamed replies: one signed request, then a bounded sequence of reply items.

``request`` answers once; some answers are made piece by piece (a language model's tokens),
and the asker wants each piece as soon as it exists. ``/gpuflex/stream/1.0.0`` carries one
signed envelope from the asker (its signer must be the peer at the other end of the Noise
session, as for direct messages), then items from the server, each a small msgpack object,
then an end mark or an error. It runs over the same connections as every other verb, so it
works wherever ``request`` does, relayed connections included.

Either side may stop early: the asker by closing the stream (the server's next write fails
and its handler is cancelled), the server by dying (the asker's next read fails at once, or
after ``item_timeout``): :class:`StreamBroken` says which item it got to.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import trio

from mesh.codec import MAX_FRAME, ReplayGuard, WireError, WireReason, open_envelope
from mesh.framing import read_frame, read_obj, write_frame, write_obj
from mesh.messaging import Inbound, Rejected, SendError

STREAM_PROTOCOL = "/gpuflex/stream/1.0.0"
#: One item's encoded size, and items per stream: a reply is many small pieces, not a blob.
MAX_ITEM = 1 << 20
MAX_ITEMS = 1_000_000

log = logging.getLogger("mesh.streaming")

Send = Callable[[Any], Awaitable[None]]
StreamHandler = Callable[[Inbound, Send], Awaitable[None]]


class StreamBroken(SendError):
    """The stream ended before its end mark: the server died, stalled or refused."""

    def __init__(self, message: str, items: int) -> None:
        super().__init__(message)
        self.items = items  # items received before it broke


class StreamTable:
    """Handlers of streamed requests, by envelope kind."""

    def __init__(self) -> None:
        self._handlers: dict[str, StreamHandler] = {}

    def register(self, kind: str, handler: StreamHandler) -> None:
        self._handlers[kind] = handler

    def get(self, kind: str) -> StreamHandler | None:
        return self._handlers.get(kind)


class StreamNode(Protocol):
    replay: ReplayGuard
    stream_handlers: StreamTable


async def serve_stream(node: StreamNode, stall_s: float, stream: Any, remote: str) -> None:
    """One inbound streamed request (run inside ``InboundStreams.guard``)."""
    frame = await read_frame(stream, MAX_FRAME, stall_s)
    env = open_envelope(frame, replay=node.replay)
    if env.sender != remote:
        raise WireError(WireReason.IMPERSONATION, f"{env.kind} signed by {env.sender[-8:]} arrived from {remote[-8:]}")
    handler = node.stream_handlers.get(env.kind)
    if handler is None:
        raise WireError(WireReason.KIND, f"no stream handler for {env.kind} requests")

    async def send(item: Any) -> None:
        await write_obj(stream, {"item": item})

    try:
        await handler(Inbound(env, None, remote, gossip=False), send)
    except Rejected as exc:
        await write_obj(stream, {"error": str(exc)})
        return
    await write_obj(stream, {"end": True})


async def read_items(stream: Any, peer: str, item_timeout: float) -> AsyncIterator[Any]:
    """The items of a streamed reply until its end mark; StreamBroken if it never comes."""
    got = 0
    while got < MAX_ITEMS:
        try:
            with trio.fail_after(item_timeout):
                obj = await read_obj(stream, MAX_ITEM)
        except trio.TooSlowError:
            raise StreamBroken(f"peer {peer[-8:]} sent nothing for {item_timeout:.0f}s", got) from None
        except trio.Cancelled:
            raise
        except Exception as exc:  # a reset, EOF or garbage: the server is gone or broken
            raise StreamBroken(f"the stream from peer {peer[-8:]} broke: {exc.__class__.__name__}", got) from None
        if not isinstance(obj, dict):
            raise StreamBroken(f"peer {peer[-8:]} sent a garbled item", got)
        if "item" in obj:
            got += 1
            yield obj["item"]
        elif obj.get("end") is True:
            return
        else:
            error = obj.get("error")
            raise StreamBroken(f"peer {peer[-8:]} refused: {str(error)[:200] if error else 'garbled item'}", got)
    raise StreamBroken(f"peer {peer[-8:]} sent more than {MAX_ITEMS} items", got)


async def send_request(stream: Any, frame: bytes) -> None:
    await write_frame(stream, frame)
