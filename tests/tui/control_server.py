"""A tiny control-API server on 127.0.0.1 that serves a FakeSource over the real wire
format (docs/control-api.md), so tui.api is tested against bytes on a socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from tests.tui.fake_source import FakeSource

TOKEN = "ab" * 32


class ControlServer:
    def __init__(self, source: FakeSource, token: str = TOKEN) -> None:
        self.source = source
        self.token = token
        self.port = 0
        self.hang = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> ControlServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def kill(self) -> None:
        """Stop listening and cut every connection, as a crashed node would."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while line := await reader.readline():
                request = json.loads(line)
                if request.get("token") != self.token:
                    await self._reply(writer, {"ok": False, "error": "unauthorized"})
                    return
                if request["method"] == "events":
                    await self._reply(writer, {"ok": True, "result": "subscribed"})
                    await self._stream(writer)
                    return
                if self.hang:
                    await asyncio.sleep(3600)
                await self._reply(writer, await self._dispatch(request))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        method, params = request["method"], request.get("params") or {}
        handlers = {
            "status": self.source.status,
            "peers": self.source.peers,
            "jobs": self.source.jobs,
        }
        if method == "ledger":
            return {"ok": True, "result": await self.source.ledger(params["job"])}
        if method not in handlers:
            return {"ok": False, "error": f"unknown method '{method}'"}
        return {"ok": True, "result": await handlers[method]()}

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        events = self.source.events()
        with contextlib.suppress(Exception):
            async for event in events:
                await self._reply(writer, {"event": event})
        await events.aclose()

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        writer.write(json.dumps(message).encode() + b"\n")
        await writer.drain()
