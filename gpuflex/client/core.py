"""The control API's client side with no I/O: what every client of the node does the same way.

The CLI (blocking sockets), the dashboard (asyncio) and the portal (trio) all speak the same
newline-delimited JSON (docs/control-api.md). What a request looks like, what a reply means
(a result, a refusal, or "the node cannot be reached, try again"), which events were already
passed on, and how long to wait before the next attempt are decided here, once, so that the
three adapters only move bytes. Nothing here opens a socket, reads a file or sleeps.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflex.errors import GpuflexError

#: The longest reply line a client reads. The node is the user's own, and a node holding many
#: jobs (or long ones) answers ``jobs`` with megabytes; past this a clear error, not a crash.
MAX_LINE = 32 << 20


class ControlError(GpuflexError, RuntimeError):
    """The node could not be reached, or it answered with an error."""


class Unreachable(ControlError):
    """The node cannot be reached right now (no answer, a closed connection, a line that is
    not JSON, a stale token): a client shows it and tries again later."""


class Refused(ControlError):
    """The node answered with an error (an unknown method or job): the request was at fault."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    token: str
    home: Path


def encode_request(token: str, method: str, params: Mapping[str, Any] | None = None) -> bytes:
    """One request line. Replies carry no id, so a connection has one request in flight."""
    return json.dumps({"token": token, "method": method, "params": dict(params or {})}).encode() + b"\n"


def parse_line(raw: bytes) -> dict[str, Any]:
    """One line from the node as a JSON object; anything else means the link is not usable."""
    if len(raw) > MAX_LINE:
        raise Unreachable(f"the node's reply is over {MAX_LINE >> 20} MiB; ask for less (one job, not all)")
    try:
        msg = json.loads(raw)
    except ValueError:
        raise Unreachable("the node sent a line that is not JSON") from None
    if not isinstance(msg, dict):
        raise Unreachable("the node sent a line that is not a JSON object")
    return msg


def result_of(reply: Mapping[str, Any]) -> Any:
    """A reply's result, or the error it carries raised as Refused (the request was at fault)
    or Unreachable (an ``unauthorized``: most likely a stale token after the node's home was
    recreated, which the next connection reads afresh, so it is worth a retry)."""
    if reply.get("ok"):
        return reply.get("result")
    error = str(reply.get("error", "unknown error"))
    if error == "unauthorized":
        raise Unreachable("unauthorized: the token does not match the node")
    raise Refused(error)


def event_of(msg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The event a pushed line carries, or None for anything else on an event stream."""
    event = msg.get("event")
    return event if isinstance(event, dict) else None


class LineBuffer:
    """Bytes in, whole lines out, for transports that deliver chunks (trio streams)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            raise Unreachable("the node closed the connection")
        self._buf += chunk

    def line(self) -> bytes | None:
        """The next whole line without its newline, or None until one has arrived."""
        end = self._buf.find(b"\n")
        if end < 0:
            if len(self._buf) > MAX_LINE:
                raise Unreachable(f"the node sent a line over {MAX_LINE >> 20} MiB")
            return None
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        return line


class SeenEvents:
    """Which events a reconnecting subscriber has already passed on.

    Every subscription asks for the node's whole recent history (``since: 0``) and drops what
    was seen, keyed by (seq, ts): a restarted node counts seq from zero again, so resuming from
    the last seq would hide its first events. The memory is bounded to the last ``limit``.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._seen: OrderedDict[tuple[Any, Any], None] = OrderedDict()

    def first_time(self, event: Mapping[str, Any]) -> bool:
        key = (event.get("seq"), event.get("ts"))
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > self.limit:
            self._seen.popitem(last=False)
        return True


class RetrySchedule:
    """How long to wait before the next attempt: the delays in turn, then the last one for
    ever; a success starts the schedule again."""

    def __init__(self, delays: tuple[float, ...]) -> None:
        if not delays or any(not math.isfinite(d) or d < 0 for d in delays):
            raise ValueError("retry delays must be finite, non-negative seconds, at least one")
        self.delays = delays
        self._attempt = 0

    def succeeded(self) -> None:
        self._attempt = 0

    def next_delay(self) -> float:
        delay = self.delays[min(self._attempt, len(self.delays) - 1)]
        self._attempt += 1
        return delay


class Subscription:
    """One event stream across reconnects: each reconnect subscribes again with the same
    request, the node replays its recent history, and only events not passed on yet come
    through (see SeenEvents); between attempts, the retry schedule says how long to wait."""

    method = "events"
    params: Mapping[str, Any] = {"since": 0}

    def __init__(self, retry_delays: tuple[float, ...]) -> None:
        self._seen = SeenEvents()
        self._schedule = RetrySchedule(retry_delays)

    def subscribed(self, reply: Mapping[str, Any]) -> None:
        result_of(reply)
        self._schedule.succeeded()

    def event(self, msg: Mapping[str, Any]) -> dict[str, Any] | None:
        """The event a line carries if it is new, else None."""
        event = event_of(msg)
        return event if event is not None and self._seen.first_time(event) else None

    def next_delay(self) -> float:
        return self._schedule.next_delay()


EndpointLike = Endpoint | Callable[[], Endpoint]


class Target:
    """Where a client connects. ``endpoint`` may be a callable (``locate`` bound to a home) so
    that every reconnect re-reads control.json and follows a node restarted on a new port."""

    def __init__(self, endpoint: EndpointLike, label: str = "node") -> None:
        self._endpoint = endpoint
        self.label = label
        self.last: Endpoint | None = endpoint if isinstance(endpoint, Endpoint) else None

    def resolve(self) -> Endpoint:
        if isinstance(self._endpoint, Endpoint):
            return self._endpoint
        try:
            self.last = self._endpoint()
        except Unreachable:
            raise
        except ControlError as exc:
            raise Unreachable(str(exc)) from None
        return self.last

    def describe(self) -> str:
        """Where the data comes from, for a banner ("127.0.0.1:43121"), once known."""
        return f"{self.last.host}:{self.last.port}" if self.last else self.label


def failure_reason(exc: BaseException, timeouts: tuple[type[BaseException], ...] = ()) -> str:
    """A transport failure in a few words ("timed out", "connection refused")."""
    if isinstance(exc, (TimeoutError, *timeouts)):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
