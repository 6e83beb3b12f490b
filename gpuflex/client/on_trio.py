"""The trio adapter of the control-API client: the portal's (Hypercorn's trio worker).

Only bytes move here; what they mean is core.py's. Every request has a deadline, because a
portal outlives the node it watches, and the node is found afresh on every reconnect.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import trio

from gpuflex.client.base import ControlBase
from gpuflex.client.core import (
    ControlError,
    Endpoint,
    EndpointLike,
    LineBuffer,
    Subscription,
    Unreachable,
    encode_request,
    failure_reason,
    parse_line,
    result_of,
)

_TIMEOUTS = (trio.TooSlowError,)
_TRANSPORT = (OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError)


class Connection:
    """One TCP connection; requests go out one at a time because replies carry no id."""

    def __init__(self, stream: trio.SocketStream, token: str) -> None:
        self.stream = stream
        self.token = token
        self._lines = LineBuffer()

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout: float) -> Connection:
        try:
            with trio.fail_after(timeout):
                stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
        except (OSError, trio.TooSlowError) as exc:
            reason = failure_reason(exc, _TIMEOUTS)
            raise Unreachable(f"no answer at {endpoint.host}:{endpoint.port} ({reason})") from None
        return cls(stream, endpoint.token)

    async def send(self, method: str, params: dict[str, Any] | None) -> None:
        await self.stream.send_all(encode_request(self.token, method, params))

    async def read(self) -> dict[str, Any]:
        while (line := self._lines.line()) is None:
            self._lines.feed(await self.stream.receive_some(65536))
        return parse_line(line)

    async def request(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        return result_of(await self.exchange(method, params, timeout))

    async def exchange(self, method: str, params: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        """One request and its reply line, as it came, within ``timeout``."""
        try:
            with trio.fail_after(timeout):
                await self.send(method, params)
                return await self.read()
        except _TRANSPORT as exc:
            raise Unreachable(f"the node did not answer ({failure_reason(exc, _TIMEOUTS)})") from None

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


class TrioControl(ControlBase):
    """One node's control API on trio.

    Requests share one lazily opened connection (a lock keeps them in turn); any transport
    failure drops it and the next call reconnects. Failures raise ``Unreachable`` (try again)
    or ``Refused`` (the request's fault).
    """

    def __init__(self, endpoint: EndpointLike, timeout: float = 5.0,
                 retry_delays: tuple[float, ...] = (1.0, 2.0, 5.0), label: str = "node") -> None:
        super().__init__(endpoint, timeout, retry_delays, label)
        self._conn: Connection | None = None
        self._lock = trio.Lock()

    async def _open(self) -> Connection:
        return await Connection.open(self._target.resolve(), self.timeout)

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float | None = None) -> Any:
        """One request. A call given its own ``timeout`` (a slow one: ``job_results``) gets a
        connection of its own, so the one-a-second polls are never queued behind it."""
        if timeout is not None:
            conn = await self._open()
            try:
                return await conn.request(method, params, timeout)
            finally:
                await conn.aclose()
        async with self._lock:
            while True:
                # A kept connection may be to a node that has since stopped (a restart on
                # another port, after a long idle): it fails at once, and one fresh connection,
                # found afresh, answers for the node as it is now rather than for its past.
                reused = self._conn is not None
                if self._conn is None:
                    self._conn = await self._open()
                conn = self._conn
                try:
                    return await conn.request(method, params, self.timeout)
                except Unreachable:
                    self._conn = None
                    await conn.aclose()
                    if not reused:
                        raise

    async def events(self) -> AsyncGenerator[dict[str, Any], None]:
        """Events forever, across reconnects, each delivered once (see Subscription)."""
        sub = Subscription(self.retry_delays)
        while True:
            with contextlib.suppress(ControlError, *_TRANSPORT):
                async with await self._open() as conn:
                    sub.subscribed(await conn.exchange(sub.method, dict(sub.params), self.timeout))
                    while True:
                        if (event := sub.event(await conn.read())) is not None:
                            yield event
            await trio.sleep(sub.next_delay())

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()
