"""Clients of a node's local control API (docs/control-api.md).

``core`` decides everything that is not I/O (requests, replies, de-duplication of events,
the retry schedule); ``sync`` (the CLI, scripts), ``on_asyncio`` (the dashboard) and
``on_trio`` (the portal) only move its bytes; ``model`` is the one typed, lenient view of the
JSON that the dashboard and the portal both draw. This package's root keeps to the standard
library so that the CLI's query commands start fast: the asyncio and trio adapters are
imported by name where they are used.
"""

from gpuflex.client.core import (
    MAX_LINE,
    ControlError,
    Endpoint,
    Refused,
    SeenEvents,
    Unreachable,
)
from gpuflex.client.files import locate
from gpuflex.client.sync import ControlClient, call

__all__ = [
    "MAX_LINE",
    "ControlClient",
    "ControlError",
    "Endpoint",
    "Refused",
    "SeenEvents",
    "Unreachable",
    "call",
    "locate",
]
