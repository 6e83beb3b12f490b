"""tui.api against a real TCP server speaking the control-API wire format."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from gpuflex.client import ControlError, Endpoint
from gpuflex.home import CONTROL_FILE, TOKEN_FILE
from tests.tui.conftest import drive, loaded, make_app, until
from tests.tui.control_server import TOKEN, ControlServer
from tests.tui.fake_source import JOB_ID, FakeSource
from tui.api import ControlSource
from tui.app import DashboardApp
from tui.source import SourceUnavailable
from tui.widgets.banner import Banner


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def endpoint(port: int, token: str = TOKEN) -> Endpoint:
    return Endpoint("127.0.0.1", port, token, Path("/nonexistent"))


async def next_event(stream: Any, timeout: float = 5.0) -> dict[str, Any]:
    return await asyncio.wait_for(stream.__anext__(), timeout)


def test_requests_and_errors() -> None:
    async def test() -> None:
        server = await ControlServer(FakeSource()).start()
        source = ControlSource(endpoint(server.port))
        status = await source.status()
        assert status["mesh"]["peers"] == 5
        assert len(await source.peers()) == 5
        assert (await source.jobs())[0]["job_id"] == JOB_ID
        assert len(await source.ledger(JOB_ID)) == 6
        with pytest.raises(ControlError, match="unknown method"):
            await source.call("nope")
        assert (await source.status())["peer_id"]  # the connection survives an error reply
        await source.aclose()
        await server.kill()

    run(test)


def test_wrong_token_is_reported() -> None:
    async def test() -> None:
        server = await ControlServer(FakeSource()).start()
        source = ControlSource(endpoint(server.port, token="00" * 32))
        with pytest.raises(SourceUnavailable, match="unauthorized"):
            await source.status()
        await server.kill()

    run(test)


def test_every_call_has_a_timeout() -> None:
    async def test() -> None:
        server = await ControlServer(FakeSource()).start()
        server.hang = True
        source = ControlSource(endpoint(server.port), timeout=0.2)
        with pytest.raises(SourceUnavailable, match="timed out"):
            await source.status()
        server.hang = False
        assert (await source.status())["peer_id"]  # a fresh connection after the timeout
        await source.aclose()
        await server.kill()

    run(test)


def test_events_stream_survives_a_node_restart() -> None:
    async def test() -> None:
        fake = FakeSource()
        server = await ControlServer(fake).start()
        port = server.port
        source = ControlSource(endpoint(port), retry_delays=(0.05,))
        stream = source.events()
        history = [await next_event(stream) for _ in range(9)]
        assert [e["seq"] for e in history] == list(range(1, 10))
        fake.emit("round_committed", "round 6 committed")
        assert (await next_event(stream))["message"] == "round 6 committed"

        await server.kill()
        with pytest.raises(SourceUnavailable):
            await source.status()
        pending = asyncio.ensure_future(next_event(stream))
        await asyncio.sleep(0.3)  # the stream keeps retrying while the node is away
        assert not pending.done()

        fake.emit("peer_down", "peer down")
        server.port = port
        await server.start()
        # History is replayed on resubscribe; only the unseen event comes through.
        assert (await pending)["type"] == "peer_down"
        assert (await source.status())["peer_id"]
        await stream.aclose()
        await source.aclose()
        await server.kill()

    run(test)


def test_for_home_reads_the_control_files_on_every_reconnect(tmp_path: Path) -> None:
    async def test() -> None:
        source = ControlSource.for_home(tmp_path, timeout=1.0)
        with pytest.raises(SourceUnavailable, match="no node is running"):
            await source.status()
        server = await ControlServer(FakeSource()).start()
        (tmp_path / TOKEN_FILE).write_text(TOKEN + "\n")
        (tmp_path / CONTROL_FILE).write_text(json.dumps({"host": "127.0.0.1", "port": server.port}))
        assert (await source.status())["mesh"]["up"] == 4
        assert source.describe() == f"127.0.0.1:{server.port}"
        await source.aclose()
        await server.kill()

    run(test)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_dashboard_over_tcp_waits_for_the_node_and_survives_its_restart() -> None:
    fake = FakeSource()
    server = ControlServer(fake)
    server.port = free_port()
    source = ControlSource(endpoint(server.port), timeout=0.5, retry_delays=(0.1,))

    async def scenario(app: DashboardApp, pilot: Pilot[None]) -> None:
        banner = app.screen.query_one(Banner)
        # Started before the node: the dashboard waits and says so.
        await until(pilot, lambda: banner.has_class("-disconnected"), what="no node yet")
        await server.start()
        await until(pilot, lambda: loaded(app))
        assert not banner.display
        await server.kill()
        await until(pilot, lambda: banner.display, what="banner")
        await server.start()
        await until(pilot, lambda: not banner.display, what="banner to clear")
        fake.emit("round_committed", "round 7 committed")
        await until(pilot, lambda: app.events[-1].message == "round 7 committed")
        await server.kill()

    drive(make_app(source), scenario)
