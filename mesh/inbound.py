"""What a node does with the streams peers open to it: messages, gossip and blob requests.

Every inbound stream is untrusted, so every one is served within ``PeerLimits``: a stream
slot per peer and in total (``Busy`` past it: the stream is reset, at no penalty), a frame
that grows only as its bytes arrive and counts against the frame-byte budget, a payload no
larger than its kind allows (the job decides for updates and partials, from its model
size), a read timeout on every read, gossip metered per origin and per forwarding peer, and
blob requests and bulk listeners capped with their transfers on a thread pool of their own.
A fault (garbage, a forged or oversized frame, a stalled stream) is logged, penalised and
dropped; the node keeps serving everyone else.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from typing import Any, Protocol

import trio

from mesh.blob import BlobStore, serve_blob
from mesh.codec import (
    MAX_FRAME,
    ReplayGuard,
    Truncated,
    WireError,
    WireReason,
    frame_msg_id,
    open_envelope,
)
from mesh.framing import Stalled, read_frame, read_growing, read_len64, write_frame, write_obj
from mesh.health import PeerTable
from mesh.limits import Busy, Charge, LogThrottle, PeerLimits, PeerQuotas
from mesh.messaging import HandlerTable, Inbound, Rejected, SeenCache
from mesh.names import peer_text
from mesh.push import PUSH_FLAG, receive_pushed

log = logging.getLogger("mesh.node")
# A cut or stalled stream can be an honest peer's timeout; forged or garbled input cannot.
PENALTY = {WireReason.TRUNCATED: 0.5, WireReason.STALE: 0.5, WireReason.STALLED: 0.5}
#: Closing or resetting a stream: the peer may be gone, never wait long for it.
STREAM_CLOSE_S = 2.0


class ServingNode(Protocol):
    """What the handlers use of their node (``mesh.node.MeshNode``)."""

    @property
    def limits(self) -> PeerLimits: ...

    @property
    def max_payload(self) -> int: ...

    @property
    def gossip_window_s(self) -> float: ...

    peers: PeerTable
    replay: ReplayGuard
    seen: SeenCache
    handlers: HandlerTable
    blobs: BlobStore
    direct_only: set[str]
    bytes_sent: int
    bytes_received: int
    bulk_bytes_received: int

    def bulk_host(self) -> str | None: ...

    def relay(self, frame: bytes, exclude: set[str], msg_id: bytes) -> None: ...

    def rejected(self, peer: str, reason: str, message: str) -> None: ...

    def in_use(self, peer: str) -> AbstractContextManager[None]: ...


class InboundStreams:
    """The node's stream handlers (``/gpuflex/msg``, ``/gpuflex/gossip``, ``/gpuflex/blob``)."""

    def __init__(self, node: ServingNode) -> None:
        self.node = node
        self.quotas = PeerQuotas(node.limits)
        self.refused_by: Counter[str] = Counter()  # streams and requests refused, by the limit that refused them
        self._busy_log = LogThrottle(log)

    @property
    def refused(self) -> int:
        """Streams and requests refused at a limit, all limits together (status, tests)."""
        return sum(self.refused_by.values())

    @property
    def stall_s(self) -> float:
        return self.node.limits.read_timeout_s

    def guard(self, handler: Callable[[Any, str], Any], quota: str = "streams") -> Callable[[Any], Any]:
        """Run ``handler`` for one stream within its peer's quota; any failure stays in it."""
        counter = getattr(self.quotas, quota)

        async def run(stream: Any) -> None:
            remote = peer_text(stream.muxed_conn.peer_id)
            if self.node.peers.is_ignored(remote):
                await reset(stream)
                return
            try:
                counter.take(remote)
            except Busy as exc:
                self.refused_by[quota] += 1
                self._busy_log.warning(f"{quota}:{remote}", f"refused a stream from {remote[-8:]}: {exc}")
                await reset(stream)
                return
            try:
                with self.node.in_use(remote):  # a connection carrying a stream is not idle
                    await handler(stream, remote)
            except WireError as exc:
                self.reject(remote, exc, stream.get_protocol() if hasattr(stream, "get_protocol") else "")
                await reset(stream)
            except Busy as exc:
                self.refused_by[f"{quota} (mid-stream)"] += 1
                self._busy_log.warning(f"{quota}:{remote}", f"dropped a stream from {remote[-8:]}: {exc}")
                await reset(stream)
            except Rejected as exc:  # refused before its payload arrived (a job not prepared yet)
                log.info("refused a message from %s: %s", remote[-8:], exc)
                await reset(stream)
            except trio.Cancelled:
                raise
            except Exception as exc:  # one stream's failure, whatever it is, never stops the node
                log.warning("error while serving %s: %s: %s", remote[-8:], exc.__class__.__name__, exc)
                await reset(stream)
            else:
                await close(stream)
            finally:
                counter.give(remote)

        return run

    def guard_plain(self, handler: Callable[[Any], Any], quota: str) -> Callable[[Any], Any]:
        """``guard`` for a handler that takes the stream alone (py-libp2p's own, such as the
        relay's hop handler): the same per-peer quota, refusals and isolation."""

        async def with_remote(stream: Any, remote: str) -> None:
            await handler(stream)

        return self.guard(with_remote, quota)

    def reject(self, peer: str, exc: WireError, what: Any) -> None:
        if isinstance(exc, (Truncated, Stalled)) and exc.received == 0:
            # The peer sent nothing at all: a timeout or a crash, not an attack.
            log.info("stream from %s (%s) ended before any data: %s", peer[-8:], what, exc)
            return
        rec = self.node.peers.penalise(peer, PENALTY.get(exc.reason, 1.0))
        log.warning("rejected input from %s (%s): %s; penalty now %.1f", peer[-8:], what, exc, rec.penalty)
        self.node.rejected(peer, exc.reason, f"rejected {what} from {peer[-8:]}: {exc}")

    async def _frame(self, stream: Any, remote: str) -> bytes:
        """One signed frame, held against the peer's share of the frame-byte budget only while
        it arrives (afterwards it is the handler's, and bounded by its kind's limit)."""
        charge = Charge(self.quotas.frame_bytes, remote)
        try:
            return await read_frame(stream, MAX_FRAME, self.stall_s, charge)
        finally:
            charge.release()

    async def handle_msg(self, stream: Any, remote: str) -> None:
        node = self.node
        frame = await self._frame(stream, remote)
        env = open_envelope(frame, replay=node.replay)
        if env.sender != remote:
            raise WireError(WireReason.IMPERSONATION,
                            f"{env.kind} signed by {env.sender[-8:]} arrived from {remote[-8:]}")
        size = await read_len64(stream, self.stall_s)
        pushed = bool(size & PUSH_FLAG)
        size &= ~PUSH_FLAG
        payload: bytes | None = None
        if size:
            limit = min(node.max_payload, await node.handlers.payload_limit(env))
            if size > limit:
                raise WireError(WireReason.OVERSIZED,
                                f"{env.kind} payload of {size} bytes exceeds its limit of {limit}")
            self.quotas.payloads.take(remote)
            try:
                if pushed:
                    payload, via_bulk = await receive_pushed(stream, size, node.bulk_host(), peer=remote,
                                                             gate=self.quotas.bulk, stall_s=self.stall_s)
                    if via_bulk:
                        node.bulk_bytes_received += size
                else:
                    payload = await read_growing(stream, size, f"{env.kind} payload", self.stall_s)
            finally:
                self.quotas.payloads.give(remote)
        node.bytes_received += len(frame) + size
        node.peers.seen(remote)
        try:
            reply = await node.handlers.dispatch(Inbound(env, payload, remote, gossip=False))
        except Rejected as exc:
            await write_obj(stream, {"ok": False, "error": str(exc)})
            return
        except WireError as exc:
            await write_obj(stream, {"ok": False, "error": str(exc)})
            raise
        await write_frame(stream, pack_reply(reply))

    async def handle_gossip(self, stream: Any, remote: str) -> None:
        node, quotas = self.node, self.quotas
        if not quotas.gossip_peers.allow(remote):
            self.refused_by["gossip_peer_rate"] += 1
            self._busy_log.warning(f"gossip-peer:{remote}", f"gossip from {remote[-8:]} is over "
                                   f"{quotas.limits.gossip_peer_rate:g} streams/s; dropping the excess")
            return
        frame = await self._frame(stream, remote)
        node.bytes_received += len(frame)
        if frame_msg_id(frame) in node.seen:  # one of up to D copies: no signature check again
            node.peers.seen(remote)
            return
        env = open_envelope(frame)
        node.peers.seen(remote)
        if abs(time.time() - env.ts) > node.gossip_window_s:
            raise WireError(WireReason.STALE, f"gossiped {env.kind} is {time.time() - env.ts:.0f}s old")
        if env.msg_id in node.seen:
            return
        if not quotas.gossip_origins.allow(env.sender):
            # Neither delivered nor relayed, and not marked seen: a copy that comes back once
            # the origin is under its rate again is taken.
            self.refused_by["gossip_origin_rate"] += 1
            self._busy_log.warning(f"gossip-origin:{env.sender}", (
                f"gossip from origin {env.sender[-8:]} (via {remote[-8:]}) is over "
                f"{quotas.limits.gossip_origin_rate:g} messages/s; not relaying the excess"))
            return
        node.seen.add(env.msg_id)
        if env.kind not in node.direct_only:
            node.relay(frame, {remote, env.sender}, env.msg_id)
        if not node.handlers.has(env.kind):
            return  # a layer this node does not run (an embedded mesh, say): relay it, nothing more
        try:
            await node.handlers.dispatch(Inbound(env, None, remote, gossip=True))
        except Rejected as exc:
            log.info("ignored gossiped %s from %s: %s", env.kind, env.sender[-8:], exc)
        except WireError as exc:
            if remote == env.sender:
                raise
            # A relay forwards gossip before any layer has judged it, so a signed message that
            # fails here is its signer's fault: penalising the relay would let a forger get
            # honest peers ignored by sending them its forgeries to pass on.
            self.reject(env.sender, exc, f"gossiped {env.kind} via {remote[-8:]}")

    async def handle_blob(self, stream: Any, remote: str) -> None:
        node = self.node
        digest = await serve_blob(stream, node.blobs, bulk_host=node.bulk_host(), peer=remote,
                                  gate=self.quotas.bulk, stall_s=self.stall_s)
        if digest:
            node.bytes_sent += node.blobs.size(digest)


def pack_reply(reply: Any) -> bytes:
    import msgpack

    return msgpack.packb({"ok": True, "reply": reply}, use_bin_type=True)


async def close(stream: Any) -> None:
    with trio.move_on_after(STREAM_CLOSE_S):
        with suppress(Exception):
            await stream.close()


async def reset(stream: Any) -> None:
    with trio.move_on_after(STREAM_CLOSE_S):
        with suppress(Exception):
            await stream.reset()
