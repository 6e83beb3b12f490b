"""A trio client of a node's control API (docs/control-api.md).

``gpuflex.client`` is synchronous and ``tui.api`` speaks asyncio; the portal runs on trio
(Hypercorn's trio worker), so it speaks the same newline-delimited JSON with trio streams.
Finding the node stays ``gpuflex.client.locate``'s job, re-run on every reconnect so the
portal follows a node that restarted on another port. Every request has a deadline, because a
portal outlives the node it watches.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

import trio

from gpuflex.client import MAX_LINE, ControlError, Endpoint, SeenEvents, locate
from web import WebError


class NodeUnavailable(WebError):
    """The node cannot be reached right now; pages say so and the portal retries."""


class NodeRefused(WebError):
    """The node answered with an error (an unknown job, say): the request was at fault."""


class Source(Protocol):
    """A node seen through its control API, as the hub and the pages use it."""

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float | None = None) -> Any: ...

    def events(self) -> AsyncGenerator[dict[str, Any], None]: ...

    def describe(self) -> str: ...

    async def aclose(self) -> None: ...


class _Connection:
    def __init__(self, stream: trio.SocketStream, token: str) -> None:
        self.stream = stream
        self.token = token
        self.buf = bytearray()

    async def send(self, method: str, params: dict[str, Any] | None) -> None:
        line = json.dumps({"token": self.token, "method": method, "params": params or {}})
        await self.stream.send_all(line.encode() + b"\n")

    async def read(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise NodeUnavailable("the node sent a line over 1 MiB")
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise NodeUnavailable("the node closed the connection")
            self.buf += chunk
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        try:
            msg = json.loads(line)
        except ValueError:
            raise NodeUnavailable("the node sent a line that is not JSON") from None
        if not isinstance(msg, dict):
            raise NodeUnavailable("the node sent a line that is not a JSON object")
        return msg

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


def _result(reply: dict[str, Any]) -> Any:
    if reply.get("ok"):
        return reply.get("result")
    error = str(reply.get("error", "unknown error"))
    if error == "unauthorized":
        # Most likely a stale token after the node's home was recreated: worth a retry, since
        # the next connection reads the token afresh.
        raise NodeUnavailable("unauthorized: the token does not match the node")
    raise NodeRefused(error)


class ControlSource:
    """The real Source: one node's control API.

    Requests share one lazily opened connection (replies carry no id, so a lock keeps them in
    turn); any transport failure drops it and the next call reconnects.
    """

    def __init__(self, endpoint: Endpoint | Callable[[], Endpoint], timeout: float = 5.0,
                 retry_delays: tuple[float, ...] = (1.0, 2.0, 5.0), label: str = "node") -> None:
        self._endpoint = endpoint
        self.timeout = timeout
        self.retry_delays = retry_delays
        self._label = label
        self._last: Endpoint | None = endpoint if isinstance(endpoint, Endpoint) else None
        self._conn: _Connection | None = None
        self._lock = trio.Lock()

    @classmethod
    def for_home(cls, home: str | os.PathLike[str] | None = None, **kwargs: Any) -> ControlSource:
        return cls(lambda: locate(home), **kwargs)

    def describe(self) -> str:
        return f"{self._last.host}:{self._last.port}" if self._last else self._label

    def _resolve(self) -> Endpoint:
        if isinstance(self._endpoint, Endpoint):
            return self._endpoint
        try:
            self._last = self._endpoint()
        except ControlError as exc:
            raise NodeUnavailable(str(exc)) from None
        return self._last

    async def _open(self) -> _Connection:
        ep = self._resolve()
        try:
            with trio.fail_after(self.timeout):
                stream = await trio.open_tcp_stream(ep.host, ep.port)
        except (OSError, trio.TooSlowError) as exc:
            raise NodeUnavailable(f"no answer at {ep.host}:{ep.port} ({_reason(exc)})") from None
        return _Connection(stream, ep.token)

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float | None = None) -> Any:
        """One request. A call given its own ``timeout`` (a slow one: ``job_results``) gets a
        connection of its own, so the one-a-second polls are never queued behind it."""
        if timeout is not None:
            conn = await self._open()
            try:
                return await self._request(conn, method, params, timeout)
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
                    return await self._request(conn, method, params, self.timeout)
                except NodeUnavailable:
                    self._conn = None
                    await conn.aclose()
                    if not reused:
                        raise

    async def _request(self, conn: _Connection, method: str, params: dict[str, Any] | None,
                       timeout: float) -> Any:
        try:
            with trio.fail_after(timeout):
                await conn.send(method, params)
                return _result(await conn.read())
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise NodeUnavailable(f"the node did not answer ({_reason(exc)})") from None

    async def events(self) -> AsyncGenerator[dict[str, Any], None]:
        """Events forever, across reconnects, each delivered once (see SeenEvents)."""
        seen = SeenEvents()
        attempt = 0
        while True:
            conn: _Connection | None = None
            try:
                conn = await self._open()
                with trio.fail_after(self.timeout):
                    await conn.send("events", {"since": 0})
                    _result(await conn.read())
                attempt = 0
                while True:
                    event = (await conn.read()).get("event")
                    if isinstance(event, dict) and seen.first_time(event):
                        yield event
            except (NodeUnavailable, NodeRefused, OSError, trio.TooSlowError,
                    trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                if conn is not None:
                    await conn.aclose()
            await trio.sleep(self.retry_delays[min(attempt, len(self.retry_delays) - 1)])
            attempt += 1

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
