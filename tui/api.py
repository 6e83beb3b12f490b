"""The dashboard's client of a node's control API (docs/control-api.md).

Textual runs on asyncio, so the dashboard uses the control-API client's asyncio adapter
(gpuflex.client.on_asyncio); requests, replies, event de-duplication and the retry schedule
are the client core's, shared with the CLI and the portal.
"""

from __future__ import annotations

from gpuflex.client.on_asyncio import AsyncioControl

ControlSource = AsyncioControl
"""The real DataSource: the control API of one node (``ControlSource.for_home(home)`` follows
the node of a home across restarts)."""
