"""Large message payloads (a member's update, a leader's partial) over the bulk side channel.

A request carries its payload behind the signed frame. Through py-libp2p's Python-level Noise
and yamux that runs near a tenth of what the TCP socket can carry, and an update the size of
the model is most of a round's upload, so above ``PUSH_MIN`` bytes the requester offers the
side channel of ``mesh.bulk`` instead:

* the length goes out with ``PUSH_FLAG`` set, then the requester's ciphers, inside Noise;
* the receiver opens a one-off port (``BulkInbox``) where the requester already reached it
  over libp2p, and answers with the port and a fresh key, inside Noise; a receiver with the
  channel off answers with no offer;
* the requester dials, proves the key, and sends sealed frames, then says ``done``; when it
  cannot dial it says ``fallback`` and the payload follows on the libp2p stream as before.

The payload stays bound to the signed frame because both travel on the same authenticated
stream's exchange, and a handler only sees the payload once every frame has authenticated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from mesh import bulk
from mesh.codec import WireError, WireReason
from mesh.framing import Stalled, Stream, read_growing, read_obj, write_len64, write_obj
from mesh.limits import BulkGate

log = logging.getLogger("gpuflex.mesh.push")

#: Payloads at least this large are offered the side channel; below it the extra round trip
#: and TCP connection cost more than Noise does.
PUSH_MIN = 1 << 20
#: Set in the payload length word when a side-channel offer follows.
PUSH_FLAG = 1 << 63


async def push_payload(stream: Stream, payload: memoryview) -> bool:
    """The requester's side, right after the frame: True when the payload went over the side
    channel, False when the caller must write it on the stream (length already sent)."""
    await write_len64(stream, len(payload) | PUSH_FLAG)
    await write_obj(stream, {"bulk": bulk.preferred_ciphers()})
    answer: Any = await read_obj(stream, 4096)
    wire = answer.get("bulk") if isinstance(answer, dict) else None
    if wire is None:
        return False  # the receiver runs without the channel
    return await dial_and_transfer(stream, wire, bulk.BulkPusher, lambda pusher: pusher.send(payload),
                                   "payload sent")


Dialer = TypeVar("Dialer", bulk.BulkReceiver, bulk.BulkPusher)


async def dial_and_transfer(stream: Stream, wire_offer: object, dialer_type: type[Dialer],
                            transfer: Callable[[Dialer], object], what: str) -> bool:
    """The dialing side of one side-channel transfer, a blob fetch or a pushed payload alike:
    connect to the offered port, run ``transfer`` on a thread, and tell the listening side
    ``done``; when the port cannot be reached, tell it ``fallback`` and return False, so the
    bytes take the libp2p stream instead."""
    offer = bulk.BulkOffer.from_wire(wire_offer)
    host = bulk.peer_ip(stream)
    dialer = dialer_type(host or "", offer)
    try:
        if host is None:
            raise bulk.BulkUnavailable("the peer's address is unknown")
        await trio.to_thread.run_sync(dialer.connect, abandon_on_cancel=True)  # type: ignore[call-arg]  # mypy misreads trio's TypeVarTuple signature
    except bulk.BulkUnavailable as exc:
        log.info("%s over libp2p: %s", what, exc)
        await write_obj(stream, {"fallback": True})
        return False
    try:
        await trio.to_thread.run_sync(transfer, dialer, abandon_on_cancel=True)  # type: ignore[call-arg]  # mypy misreads trio's TypeVarTuple signature
    except BaseException:
        dialer.abort()
        raise
    await write_obj(stream, {"done": True})
    return True


async def await_verdict(stream: Stream, ended: trio.Event, grace_s: float) -> Any:
    """The other side's word on a side-channel transfer (``done`` or ``fallback``). No limit
    while the transfer's thread runs, which has its own I/O timeouts; ``grace_s`` once it has
    ended, so a peer that asks for a transfer and then never dials or answers frees the
    stream within the listener's accept timeout plus ``grace_s``."""
    verdict: Any = None
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def arm() -> None:
                await ended.wait()
                scope.deadline = trio.current_time() + grace_s

            nursery.start_soon(arm)
            verdict = await read_obj(stream, 64)
            nursery.cancel_scope.cancel()
    if scope.cancelled_caught:
        raise Stalled(f"no word on the bulk transfer {grace_s:g} s after it ended", 0)
    return verdict


async def receive_pushed(stream: Stream, size: int, bulk_host: str | None, *, peer: str = "",
                         gate: BulkGate | None = None, stall_s: float | None = None) -> tuple[bytes, bool]:
    """The handler's side, after a length with ``PUSH_FLAG``: the payload, and whether it came
    over the side channel (``bulk_host`` None, or no listener free in ``gate``: this node
    declines the offer and the bytes come on the stream)."""
    ask: Any = await read_obj(stream, 4096, stall_s)
    cipher = bulk.choose_cipher(ask.get("bulk") if isinstance(ask, dict) else None) if bulk_host else None
    inbox: bulk.BulkInbox | None = None
    opened = cipher is not None and bulk_host is not None and (gate is None or gate.open(peer))
    try:
        if opened and cipher is not None and bulk_host is not None:
            try:
                inbox = bulk.BulkInbox(bulk_host, bulk.peer_ip(stream), cipher)
            except bulk.BulkUnavailable as exc:
                log.info("payload taken over libp2p: %s", exc)
        await write_obj(stream, {"bulk": inbox.offer.to_wire()} if inbox is not None else {})
        if inbox is not None:
            threads = gate.threads if gate is not None else None
            got = await _take(stream, inbox, size, threads, stall_s or bulk.IO_TIMEOUT_S)
            if got is not None:
                return got, True
        return await read_growing(stream, size, "payload", stall_s), False
    finally:
        if opened and gate is not None:
            gate.close(peer)


async def _take(stream: Stream, inbox: bulk.BulkInbox, size: int, threads: trio.CapacityLimiter | None,
                grace_s: float) -> bytes | None:
    """Receive ``size`` bytes over the side channel; None when the requester fell back. The
    buffer grows as sealed frames authenticate, never past ``size``."""
    buf = bytearray()
    failure: list[BaseException] = []
    ended = trio.Event()

    def sink(chunk: memoryview) -> None:
        buf[len(buf):] = chunk

    async with trio.open_nursery() as nursery:

        async def receive() -> None:
            try:
                await trio.to_thread.run_sync(inbox.receive, size, sink, abandon_on_cancel=True,  # type: ignore[call-arg]  # mypy misreads trio's TypeVarTuple signature
                                              limiter=threads)
            except (bulk.BulkUnavailable, WireError, OSError) as exc:
                failure.append(exc)
            finally:
                ended.set()

        nursery.start_soon(receive)
        try:
            verdict: Any = await await_verdict(stream, ended, grace_s)
        except BaseException:
            inbox.close()
            raise
        if isinstance(verdict, dict) and verdict.get("fallback"):
            inbox.close()
            nursery.cancel_scope.cancel()
            return None
    if failure or len(buf) != size:
        detail = failure[0] if failure else f"{len(buf)} of {size} bytes"
        raise WireError(WireReason.TRUNCATED, f"pushed payload did not arrive over the bulk channel: {detail}")
    return bytes(buf)
