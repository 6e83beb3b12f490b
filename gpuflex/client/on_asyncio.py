"""The asyncio adapter of the control-API client: the dashboard's (Textual runs on asyncio).

Only bytes move here; what they mean is core.py's. Every wait has a timeout and the client
reconnects, because a dashboard outlives the node it watches: the node restarts, the SSH
tunnel drops, the port changes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from gpuflex.client.base import ControlBase
from gpuflex.client.core import (
    MAX_LINE,
    ControlError,
    Endpoint,
    EndpointLike,
    Subscription,
    Unreachable,
    encode_request,
    failure_reason,
    parse_line,
    result_of,
)

_TIMEOUTS = (asyncio.TimeoutError,)


class Connection:
    """One TCP connection; requests go out one at a time because replies carry no id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str) -> None:
        self._reader = reader
        self._writer = writer
        self._token = token
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout: float) -> Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(endpoint.host, endpoint.port, limit=MAX_LINE + 1), timeout
            )
        except (OSError, asyncio.TimeoutError) as exc:
            reason = failure_reason(exc, _TIMEOUTS)
            raise Unreachable(f"no answer at {endpoint.host}:{endpoint.port} ({reason})") from None
        return cls(reader, writer, endpoint.token)

    async def call(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        return result_of(await self.exchange(method, params, timeout))

    async def exchange(self, method: str, params: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        """One request and its reply line, as it came."""
        async with self._lock:
            try:
                self._writer.write(encode_request(self._token, method, params))
                await asyncio.wait_for(self._writer.drain(), timeout)
            except (OSError, asyncio.TimeoutError) as exc:
                raise Unreachable(f"send failed ({failure_reason(exc, _TIMEOUTS)})") from None
            return await self.read_line(timeout)

    async def read_line(self, timeout: float | None) -> dict[str, Any]:
        try:
            raw = await asyncio.wait_for(self._reader.readline(), timeout)
        except (OSError, ValueError, asyncio.LimitOverrunError, asyncio.TimeoutError) as exc:
            raise Unreachable(f"the node did not answer ({failure_reason(exc, _TIMEOUTS)})") from None
        if not raw:
            raise Unreachable("the node closed the connection")
        return parse_line(raw)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)


class AsyncioControl(ControlBase):
    """One node's control API on asyncio.

    Requests share one lazily opened connection, dropped on any failure and reopened by the
    next call. Failures raise ``Unreachable`` (try again) or ``Refused`` (the request's fault).
    """

    def __init__(
        self,
        endpoint: EndpointLike,
        timeout: float = 3.0,
        retry_delays: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0),
        label: str = "node",
    ) -> None:
        super().__init__(endpoint, timeout, retry_delays, label)
        self._conn: Connection | None = None
        self._connecting = asyncio.Lock()

    async def _connection(self) -> Connection:
        async with self._connecting:
            if self._conn is None:
                self._conn = await Connection.open(self._target.resolve(), self.timeout)
            return self._conn

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One request; a transport failure closes the connection so the next call starts
        clean instead of reading a late reply meant for this one."""
        conn = await self._connection()
        try:
            return await conn.call(method, params, self.timeout)
        except Unreachable:
            if self._conn is conn:
                self._conn = None
            await conn.close()
            raise

    async def status(self) -> dict[str, Any]:
        return await self.call("status")

    async def peers(self) -> list[dict[str, Any]]:
        return await self.call("peers")

    async def jobs(self) -> list[dict[str, Any]]:
        return await self.call("jobs")

    async def ledger(self, job: str) -> list[dict[str, Any]]:
        return await self.call("ledger", {"job": job})

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Events forever, across reconnects, each delivered once (see Subscription)."""
        sub = Subscription(self.retry_delays)
        while True:
            with contextlib.suppress(ControlError):
                async with await Connection.open(self._target.resolve(), self.timeout) as conn:
                    sub.subscribed(await conn.exchange(sub.method, dict(sub.params), self.timeout))
                    while True:
                        if (event := sub.event(await conn.read_line(None))) is not None:
                            yield event
            await asyncio.sleep(sub.next_delay())

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
