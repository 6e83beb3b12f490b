"""The node's local control API server (protocol in docs/control-api.md).

It binds to 127.0.0.1 only and checks a token from a 0600 file on every request, so only the
node's owner (or someone they hand the token to over an SSH tunnel) can drive it.

Any local process can connect, though, so what a connection costs before its token is checked
is bounded: at most ``MAX_CONNECTIONS`` are open at once (a new one beyond is closed at once); a
connection must show a valid token within ``AUTH_TIMEOUT_S`` with a line of at most
``MAX_AUTH_LINE`` bytes; and at most ``MAX_UNAUTHENTICATED`` wait for that at once, the oldest
closed first when another arrives, so a client that sends its token at once always gets in.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from gpuflex.errors import GpuflexError
from gpuflex.home import CONTROL_FILE, TOKEN_FILE
from gpuflex.localauth import load_or_create_token
from gpuflex.node.events import EventLog
from mesh.fsutil import atomic_write_text

log = logging.getLogger("gpuflex.control")
MAX_LINE = 1 << 20
#: Connections open at once, authenticated or not.
MAX_CONNECTIONS = 64
#: Connections still waiting to show a token; the oldest is closed when another arrives.
MAX_UNAUTHENTICATED = 16
#: A connection that shows no valid token within this long is closed.
AUTH_TIMEOUT_S = 5.0
#: The longest request line before a valid token has been seen.
MAX_AUTH_LINE = 64 << 10

Method = Callable[[dict[str, Any]], Awaitable[Any]]


class ApiError(GpuflexError):
    """An error reply with a message meant for the user."""


class ControlServer:
    def __init__(self, home: Path, methods: dict[str, Method], events: EventLog, peer_id: str,
                 port: int = 0) -> None:
        self.home = home
        self.methods = methods
        self.events = events
        self.peer_id = peer_id
        self.port = port
        self.token = load_or_create_token(home / TOKEN_FILE)
        self._open = 0
        self._waiting: deque[trio.CancelScope] = deque()  # connections yet to show a token, oldest first

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        info = {"host": "127.0.0.1", "port": port, "pid": os.getpid(), "peer_id": self.peer_id}
        atomic_write_text(self.home / CONTROL_FILE, json.dumps(info), mode=0o600)
        task_status.started(port)
        try:
            await trio.serve_listeners(self._serve, listeners)
        finally:
            self.remove_file()

    def remove_file(self) -> None:
        path = self.home / CONTROL_FILE
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass

    async def _serve(self, stream: trio.SocketStream) -> None:
        if self._open >= MAX_CONNECTIONS:
            log.warning("control API: %d connections open, its limit; closing a new one", self._open)
            await stream.aclose()
            return
        self._open += 1
        buf = bytearray()
        try:
            line = await self._first_request(stream, buf)
            while line is not None:
                keep_open, _ = await self._handle_line(stream, line)
                if not keep_open:
                    return
                line, buf = await _read_line(stream, buf)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception as exc:  # the API must never take the node down
            log.warning("control connection failed: %s", exc)
        finally:
            self._open -= 1
            await stream.aclose()

    async def _first_request(self, stream: trio.SocketStream, buf: bytearray) -> bytes | None:
        """The first request line that shows the token, read within ``AUTH_TIMEOUT_S`` while
        this connection is among the ``MAX_UNAUTHENTICATED`` newest waiting ones; None when the
        connection is to be closed. It is served afterwards, with no time limit."""
        with trio.move_on_after(AUTH_TIMEOUT_S) as scope:
            self._waiting.append(scope)
            while len(self._waiting) > MAX_UNAUTHENTICATED:
                self._waiting.popleft().cancel()
            try:
                while True:
                    line, rest = await _read_line(stream, buf, MAX_AUTH_LINE)
                    buf[:] = rest
                    if line is None or self._authorized(line):
                        return line
                    keep_open, _ = await self._handle_line(stream, line)  # says what is wrong
                    if not keep_open:
                        return None
            finally:
                if scope in self._waiting:
                    self._waiting.remove(scope)
        log.debug("control API: closed a connection that showed no token in time")
        return None

    def _authorized(self, line: bytes) -> bool:
        try:
            req = json.loads(line)
        except ValueError:
            return False
        token = req.get("token") if isinstance(req, dict) else None
        return isinstance(token, str) and hmac.compare_digest(token, self.token)

    async def _handle_line(self, stream: trio.SocketStream, line: bytes) -> tuple[bool, bool]:
        """(keep the connection open, the request showed the token)."""
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError:
            await _send(stream, {"ok": False, "error": "request is not a JSON object"})
            return True, False
        if not self._authorized(line):
            await _send(stream, {"ok": False, "error": "unauthorized"})
            return False, False
        return await self._dispatch(stream, req), True

    async def _dispatch(self, stream: trio.SocketStream, req: dict[str, Any]) -> bool:
        method = req.get("method")
        params = req.get("params") or {}
        if method == "events":
            await self._stream_events(stream, int(params.get("since", 0) or 0))
            return False
        handler = self.methods.get(method) if isinstance(method, str) else None
        if handler is None or not isinstance(params, dict):
            await _send(stream, {"ok": False, "error": f"unknown method {method!r}"})
            return True
        try:
            result = await handler(params)
        except ApiError as exc:
            await _send(stream, {"ok": False, "error": str(exc)})
            return True
        except Exception as exc:  # a failing method answers with an error; the API keeps serving
            log.exception("control method %s failed", method)
            await _send(stream, {"ok": False, "error": f"{method} failed: {exc}"})
            return True
        await _send(stream, {"ok": True, "result": result})
        return True

    async def _stream_events(self, stream: trio.SocketStream, since: int) -> None:
        recv = self.events.subscribe()
        await _send(stream, {"ok": True, "result": "subscribed"})
        last = since
        for event in self.events.history(since):
            await _send(stream, {"event": event})
            last = event["seq"]
        async with recv:
            async for event in recv:
                if event["seq"] > last:
                    await _send(stream, {"event": event})


async def _send(stream: trio.SocketStream, obj: Any) -> None:
    await stream.send_all(json.dumps(obj, default=str).encode() + b"\n")


async def _read_line(stream: trio.SocketStream, buf: bytearray,
                     limit: int = MAX_LINE) -> tuple[bytes | None, bytearray]:
    while b"\n" not in buf:
        if len(buf) > limit:
            await _send(stream, {"ok": False, "error": "request line too long"})
            return None, buf
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None, buf
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    return line, bytearray(rest)
