"""What the dashboard needs from a node, as a protocol.

The app depends on this and not on the wire, so tests drive it with an in-memory fake and
the real implementation (tui.api.ControlSource) stays a thin client of the control API.
Methods return the API's JSON unchanged; tui.model parses it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from gpuflex.client.core import Unreachable

SourceUnavailable = Unreachable
"""The node cannot be reached right now; the dashboard shows a banner and retries."""


@runtime_checkable
class DataSource(Protocol):
    """A node seen through its control API. Calls may raise on any failure; the app treats
    every exception as "disconnected" and tries again later."""

    async def status(self) -> dict[str, Any]: ...

    async def peers(self) -> list[dict[str, Any]]: ...

    async def jobs(self) -> list[dict[str, Any]]: ...

    async def ledger(self, job: str) -> list[dict[str, Any]]: ...

    def events(self) -> AsyncIterator[dict[str, Any]]:
        """Events oldest first, then live. May end or raise; the app subscribes again."""
        ...

    async def aclose(self) -> None: ...

    def describe(self) -> str:
        """Where the data comes from, for the banner ("127.0.0.1:43121")."""
        ...
