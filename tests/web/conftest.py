"""The portal served for real (Hypercorn, trio, a real socket on 127.0.0.1) over a fake
control API, and an HTTP client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from gpuflex_web.app import Portal
from gpuflex_web.exports import Exporter
from gpuflex_web.server import serve
from tests.tui.fake_source import NOW
from tests.web.browser import ensure_chromium
from tests.web.fake_api import FakeApi


@dataclass
class Served:
    url: str
    api: FakeApi
    portal: Portal
    client: httpx.AsyncClient


async def start(nursery: trio.Nursery, tmp_path: Path, token: str | None = None) -> Served:
    api = FakeApi()
    portal = Portal(api, token=token, exporter=Exporter(api, tmp_path / "exports"),
                    wall_clock=lambda: NOW, version="test")
    url = await nursery.start(serve, portal, "127.0.0.1", 0)
    # What a browser sends from the portal's own pages: its origin on every state-changing request.
    client = httpx.AsyncClient(base_url=url, timeout=10, headers={"accept": "text/html", "origin": url})
    return Served(url, api, portal, client)


@pytest.fixture(scope="module")
def chromium() -> tuple[str, str]:
    """Headless Chromium and its driver, installed from Debian's packages when root."""
    found = ensure_chromium()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture
async def served(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Served]:
    s = await start(nursery, tmp_path)
    async with s.client:
        yield s


async def next_update(lines: AsyncIterator[str]) -> dict:
    """The next ``update`` event of a live stream, as JSON."""
    import json

    event = ""
    async for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "update":
            return dict(json.loads(line[6:]))
    raise AssertionError("the live stream ended")
