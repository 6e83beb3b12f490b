"""Serving the portal: Hypercorn's trio worker on the address the user chose.

``serve`` runs until cancelled (Ctrl-C in ``gpuflex web``, a cancel scope in the tests) and
reports the bound URL through ``task_status``, so port 0 (an ephemeral port) works.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from gpuflex_web.app import Portal


def bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def config(host: str, port: int) -> Config:
    cfg = Config()
    cfg.bind = [bind_address(host, port)]
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("gpuflex.web")
    cfg.include_server_header = False
    cfg.graceful_timeout = 1.0
    return cfg


async def serve(portal: Portal, host: str = "127.0.0.1", port: int = 0, *,
                task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled; ``task_status.started`` gets the portal's base URL."""
    app: Any = portal.app()  # an ASGI app; Hypercorn's own scope types are narrower than ours
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(hypercorn_serve, app, config(host, port)))
        task_status.started(urls[0].rstrip("/") if urls else f"http://{bind_address(host, port)}")
