"""gpuflex_web.source against a real TCP server speaking the control API's wire format
(docs/control-api.md): newline-delimited JSON, a token on every request, events pushed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from gpuflex.client import Endpoint
from gpuflex.home import CONTROL_FILE, TOKEN_FILE
from gpuflex_web.source import ControlSource, NodeRefused, NodeUnavailable
from tests.web.fake_api import FakeApi

TOKEN = "ab" * 32


class WireServer:
    """A FakeApi on 127.0.0.1, over the wire; ``stop()`` cuts every connection like a crash."""

    def __init__(self, api: FakeApi, hang: bool = False) -> None:
        self.api = api
        self.hang = hang
        self.port = 0
        self.scope: trio.CancelScope | None = None

    async def start(self, nursery: trio.Nursery) -> WireServer:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        self.scope = trio.CancelScope()

        async def run() -> None:
            assert self.scope is not None
            with self.scope:
                await trio.serve_listeners(self._serve, listeners)

        nursery.start_soon(run)
        return self

    def stop(self) -> None:
        assert self.scope is not None
        self.scope.cancel()

    async def _serve(self, stream: trio.SocketStream) -> None:
        buf = b""
        async with stream:
            while True:
                while b"\n" not in buf:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                line, _, buf = buf.partition(b"\n")
                req = json.loads(line)
                if req.get("token") != TOKEN:
                    await send(stream, {"ok": False, "error": "unauthorized"})
                    return
                if self.hang:
                    await trio.sleep_forever()
                if req["method"] == "events":
                    await send(stream, {"ok": True, "result": "subscribed"})
                    async for event in self.api.events():
                        await send(stream, {"event": event})
                try:
                    result = await self.api.call(req["method"], req.get("params"))
                except NodeRefused as exc:
                    await send(stream, {"ok": False, "error": str(exc)})
                else:
                    await send(stream, {"ok": True, "result": result})


async def send(stream: trio.SocketStream, msg: dict[str, Any]) -> None:
    await stream.send_all(json.dumps(msg).encode() + b"\n")


def endpoint(port: int, token: str = TOKEN) -> Endpoint:
    return Endpoint("127.0.0.1", port, token, Path("/nonexistent"))


async def test_requests_errors_and_a_node_that_comes_back(nursery: trio.Nursery) -> None:
    server = await WireServer(FakeApi()).start(nursery)
    source = ControlSource(endpoint(server.port), timeout=2)
    assert len(await source.call("peers")) == 5
    with pytest.raises(NodeRefused, match="unknown method"):
        await source.call("nope")
    assert (await source.call("status"))["mesh"]["peers"] == 5  # the connection survived
    with pytest.raises(NodeUnavailable, match="unauthorized"):
        await ControlSource(endpoint(server.port, "00" * 32)).call("status")
    server.stop()
    await trio.sleep(0.05)
    with pytest.raises(NodeUnavailable):
        await source.call("status")
    await server.start(nursery)  # the same port again
    assert (await source.call("status"))["peer_id"]
    await source.aclose()


async def test_every_request_has_a_deadline(nursery: trio.Nursery) -> None:
    server = await WireServer(FakeApi(), hang=True).start(nursery)
    source = ControlSource(endpoint(server.port), timeout=0.2)
    with pytest.raises(NodeUnavailable, match="timed out"):
        await source.call("status")
    with pytest.raises(NodeUnavailable, match="timed out"):
        await source.call("job_results", {"job": "x", "out": "/tmp/x"}, timeout=0.3)


async def test_events_resume_after_a_restart_without_repeats(nursery: trio.Nursery, tmp_path: Path) -> None:
    api = FakeApi()
    server = await WireServer(api).start(nursery)
    (tmp_path / TOKEN_FILE).write_text(TOKEN + "\n")

    def point_at(port: int) -> None:
        (tmp_path / CONTROL_FILE).write_text(json.dumps({"host": "127.0.0.1", "port": port}))

    point_at(server.port)
    source = ControlSource.for_home(tmp_path, retry_delays=(0.05,))
    stream = source.events()
    with trio.fail_after(5):
        seqs = [(await stream.__anext__())["seq"] for _ in range(9)]
    assert seqs == list(range(1, 10))
    server.stop()
    api.event_log.append({**api.event_log[-1], "seq": 10, "type": "peer_down", "message": "gone"})
    restarted = await WireServer(api).start(nursery)  # a new port: control.json says which
    point_at(restarted.port)
    with trio.fail_after(5):
        event = await stream.__anext__()
    assert event["seq"] == 10 and event["type"] == "peer_down"  # history replayed, only new shown
    await stream.aclose()
    await source.aclose()


async def test_a_node_restarted_on_another_port_answers_the_very_next_call(nursery: trio.Nursery,
                                                                           tmp_path: Path) -> None:
    """After a long idle across a node restart, the kept connection is dead: the next call
    must answer from the node as it is now, not fail and leave the portal showing old data."""
    api = FakeApi()
    server = await WireServer(api).start(nursery)
    (tmp_path / TOKEN_FILE).write_text(TOKEN + "\n")
    (tmp_path / CONTROL_FILE).write_text(json.dumps({"host": "127.0.0.1", "port": server.port}))
    source = ControlSource.for_home(tmp_path, timeout=2)
    assert len(await source.call("jobs")) == 2
    server.stop()
    api.job_list.append({**api.job_list[0], "job_id": "f" * 16, "name": "after the restart"})
    restarted = await WireServer(api).start(nursery)
    (tmp_path / CONTROL_FILE).write_text(json.dumps({"host": "127.0.0.1", "port": restarted.port}))
    jobs = await source.call("jobs")  # no NodeUnavailable first
    assert [j["name"] for j in jobs][-1] == "after the restart"
    assert source.describe() == f"127.0.0.1:{restarted.port}"
    await source.aclose()
