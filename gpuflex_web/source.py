"""The portal's client of a node's control API (docs/control-api.md).

The portal runs on trio (Hypercorn's trio worker), so it uses the control-API client's trio
adapter (gpuflex.client.on_trio); requests, replies, event de-duplication and the retry
schedule are the client core's, shared with the CLI and the dashboard. The hub and the pages
depend on the ``Source`` protocol, so tests drive them with an in-memory fake.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from gpuflex.client.core import Refused, Unreachable
from gpuflex.client.on_trio import TrioControl

NodeUnavailable = Unreachable
"""The node cannot be reached right now; pages say so and the portal retries."""
NodeRefused = Refused
"""The node answered with an error (an unknown job, say): the request was at fault."""
ControlSource = TrioControl
"""The real Source: one node's control API."""


class Source(Protocol):
    """A node seen through its control API, as the hub and the pages use it."""

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   timeout: float | None = None) -> Any: ...

    def events(self) -> AsyncGenerator[dict[str, Any], None]: ...

    def describe(self) -> str: ...

    async def aclose(self) -> None: ...
