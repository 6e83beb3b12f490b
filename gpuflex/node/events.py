"""The node's event history, fanned out to control-API subscribers.

The dashboard and ``gpuflex demo`` show what a node is doing from these events alone, so the
log keeps a bounded history (a late subscriber sees recent context) and never blocks the
node: a subscriber that cannot keep up loses events rather than stalling training.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import trio

from gpuflex.node.core.kinds import EventKind
from mesh.node import MeshEvent

log = logging.getLogger("gpuflex.events")


class EventLog:
    def __init__(self, history: int = 500) -> None:
        self._history: deque[dict[str, Any]] = deque(maxlen=history)
        self._subscribers: list[trio.MemorySendChannel[dict[str, Any]]] = []
        self._seq = 0

    def emit(self, type_: EventKind | MeshEvent, *, job: str | None = None, round: int | None = None,
             peer: str | None = None, message: str = "", **extra: Any) -> dict[str, Any]:
        self._seq += 1
        event = {"seq": self._seq, "ts": time.time(), "type": str(type_), "job": job, "round": round,
                 "peer": peer, "message": message or type_.replace("_", " "), **extra}
        self._history.append(event)
        log.info("%s", event["message"], extra={"event": event})
        for chan in list(self._subscribers):
            try:
                chan.send_nowait(event)
            except trio.WouldBlock:
                pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(chan)
        return event

    def history(self, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self._history if e["seq"] > since]

    def subscribe(self) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        send, recv = trio.open_memory_channel[dict[str, Any]](1000)
        self._subscribers.append(send)
        return recv
