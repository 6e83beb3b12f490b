"""An asyncio client of a node's control API (docs/control-api.md).

gpuflex.client is synchronous and would block Textual's event loop, so the dashboard speaks
the same newline-delimited JSON here with asyncio streams. Finding the node is still
gpuflex.client.locate's job; this module only adds timeouts and reconnection, because a
dashboard outlives the node it watches: the node restarts, the SSH tunnel drops, the port
changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from gpuflex.client import MAX_LINE, ControlError, Endpoint, SeenEvents, locate
from gpuflex.home import resolve_home
from tui.source import SourceUnavailable

EndpointLike = Endpoint | Callable[[], Endpoint]


class Connection:
    """One TCP connection; requests go out one at a time because replies carry no id."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str
    ) -> None:
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
            raise SourceUnavailable(
                f"no answer at {endpoint.host}:{endpoint.port} ({_reason(exc)})"
            ) from None
        return cls(reader, writer, endpoint.token)

    async def call(self, method: str, params: dict[str, Any] | None, timeout: float) -> Any:
        async with self._lock:
            line = json.dumps({"token": self._token, "method": method, "params": params or {}})
            try:
                self._writer.write(line.encode() + b"\n")
                await asyncio.wait_for(self._writer.drain(), timeout)
            except (OSError, asyncio.TimeoutError) as exc:
                raise SourceUnavailable(f"send failed ({_reason(exc)})") from None
            return _result(await self.read_line(timeout))

    async def read_line(self, timeout: float | None) -> dict[str, Any]:
        try:
            raw = await asyncio.wait_for(self._reader.readline(), timeout)
        except (OSError, ValueError, asyncio.LimitOverrunError, asyncio.TimeoutError) as exc:
            raise SourceUnavailable(f"the node did not answer ({_reason(exc)})") from None
        if not raw:
            raise SourceUnavailable("the node closed the connection")
        try:
            msg = json.loads(raw)
        except ValueError:
            raise SourceUnavailable("the node sent a line that is not JSON") from None
        if not isinstance(msg, dict):
            raise SourceUnavailable("the node sent a line that is not a JSON object")
        return msg

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)


def _result(reply: dict[str, Any]) -> Any:
    if not reply.get("ok"):
        error = str(reply.get("error", "unknown error"))
        if error == "unauthorized":
            # Most likely a stale token after the node's home was recreated; locate() reads
            # it afresh on the next attempt, so this is worth retrying like a disconnect.
            raise SourceUnavailable("unauthorized: the token does not match the node")
        raise ControlError(error)
    return reply.get("result")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


class ControlSource:
    """The real DataSource: the control API of one node.

    Requests share one lazily opened connection, dropped on any failure and reopened by
    the next call. ``endpoint`` may be a callable (see ``for_home``) so that every reconnect
    re-reads control.json and follows a node that restarted on a new port.
    """

    def __init__(
        self,
        endpoint: EndpointLike,
        timeout: float = 3.0,
        retry_delays: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0),
        label: str = "node",
    ) -> None:
        self._endpoint = endpoint
        self._label = label
        self.timeout = timeout
        self.retry_delays = retry_delays
        self._conn: Connection | None = None
        self._connecting = asyncio.Lock()
        self._last: Endpoint | None = endpoint if isinstance(endpoint, Endpoint) else None

    @classmethod
    def for_home(cls, home: str | os.PathLike[str] | None = None, **kwargs: Any) -> ControlSource:
        kwargs.setdefault("label", f"the node of {resolve_home(home)}")
        return cls(lambda: locate(home), **kwargs)

    def describe(self) -> str:
        if self._last is None:
            return self._label
        return f"{self._last.host}:{self._last.port}"

    def _resolve(self) -> Endpoint:
        if isinstance(self._endpoint, Endpoint):
            return self._endpoint
        try:
            self._last = self._endpoint()
        except ControlError as exc:
            raise SourceUnavailable(str(exc)) from None
        return self._last

    async def _connection(self) -> Connection:
        async with self._connecting:
            if self._conn is None:
                self._conn = await Connection.open(self._resolve(), self.timeout)
            return self._conn

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One request; a transport failure closes the connection so the next call starts
        clean instead of reading a late reply meant for this one."""
        conn = await self._connection()
        try:
            return await conn.call(method, params, self.timeout)
        except SourceUnavailable:
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
        """Events forever, across reconnects, each delivered once (see SeenEvents)."""
        seen = SeenEvents()
        attempt = 0
        while True:
            conn: Connection | None = None
            try:
                conn = await Connection.open(self._resolve(), self.timeout)
                await conn.call("events", {"since": 0}, self.timeout)
                attempt = 0
                while True:
                    msg = await conn.read_line(None)
                    event = msg.get("event")
                    if not isinstance(event, dict):
                        continue
                    if seen.first_time(event):
                        yield event
            except (SourceUnavailable, ControlError):
                pass
            finally:
                if conn is not None:
                    await conn.close()
            await asyncio.sleep(self.retry_delays[min(attempt, len(self.retry_delays) - 1)])
            attempt += 1

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
