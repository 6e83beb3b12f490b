"""Synchronous client for a node's local control API (see docs/control-api.md).

The CLI's query commands must start in well under a second, so this module uses only the
standard library: no trio, no libp2p, no torch.
"""

from __future__ import annotations

import json
import os
import socket
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflex.errors import GpuflexError
from gpuflex.home import CONTROL_FILE, TOKEN_FILE, resolve_home

#: The longest reply line a client reads. The node is the user's own, and a node holding many
#: jobs (or long ones) answers ``jobs`` with megabytes; past this a clear error, not a crash.
MAX_LINE = 32 << 20


class ControlError(GpuflexError, RuntimeError):
    """The node could not be reached, or it answered with an error."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    token: str
    home: Path


def locate(home: str | os.PathLike[str] | None = None) -> Endpoint:
    """Find a running node's API from the files in its home directory."""
    root = resolve_home(home)
    info_path = root / CONTROL_FILE
    try:
        info = json.loads(info_path.read_text())
        token = (root / TOKEN_FILE).read_text().strip()
    except FileNotFoundError:
        raise ControlError(f"no node is running for home {root} (start one with 'gpuflex node start')") from None
    except (OSError, ValueError) as exc:
        raise ControlError(f"cannot read the control files in {root}: {exc}") from None
    return Endpoint(str(info.get("host", "127.0.0.1")), int(info["port"]), token, root)


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


class ControlClient:
    """One connection to a node; requests are answered in order."""

    def __init__(self, endpoint: Endpoint, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        try:
            self._sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        except OSError as exc:
            raise ControlError(
                f"no node answers for home {endpoint.home} at {endpoint.host}:{endpoint.port} ({exc.strerror or exc})"
            ) from None
        self._file = self._sock.makefile("rwb")

    @classmethod
    def for_home(cls, home: str | os.PathLike[str] | None = None, timeout: float = 10.0) -> ControlClient:
        return cls(locate(home), timeout=timeout)

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, params: dict[str, Any] | None) -> None:
        line = json.dumps({"token": self.endpoint.token, "method": method, "params": params or {}})
        self._file.write(line.encode() + b"\n")
        self._file.flush()

    def _recv(self) -> Any:
        try:
            raw = self._file.readline(MAX_LINE + 1)
        except (TimeoutError, OSError) as exc:
            raise ControlError(f"the node did not answer: {exc}") from None
        if not raw:
            raise ControlError("the node closed the connection")
        if len(raw) > MAX_LINE:
            raise ControlError(f"the node's reply is over {MAX_LINE >> 20} MiB; ask for less (one job, not all)")
        try:
            reply = json.loads(raw)
        except ValueError as exc:
            raise ControlError(f"the node's reply is not JSON: {exc}") from None
        if not isinstance(reply, dict):
            raise ControlError("the node's reply is not a JSON object")
        if not reply.get("ok"):
            raise ControlError(str(reply.get("error", "unknown error")))
        return reply.get("result")

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send one request and return its result, raising ControlError on an error reply."""
        self._send(method, params)
        return self._recv()

    # Convenience wrappers: the same data as the CLI's --json commands, named like them.

    def status(self) -> dict[str, Any]:
        """``gpuflex status --json``: this node, its mesh and its jobs."""
        return dict(self.call("status"))

    def peers(self) -> list[dict[str, Any]]:
        """``gpuflex peers --json``: every known peer with health and hardware."""
        return list(self.call("peers"))

    def jobs(self) -> list[dict[str, Any]]:
        """Every job this node knows, newest first."""
        return list(self.call("jobs"))

    def job_status(self, job: str | None = None) -> dict[str, Any]:
        """``gpuflex job status --json``: one job (default: the newest)."""
        return dict(self.call("job_status", {"job": job} if job else {}))

    def ledger(self, job: str | None = None) -> list[dict[str, Any]]:
        """The job's committed rounds, oldest first."""
        return list(self.call("ledger", {"job": job} if job else {}))

    def job_results(self, job: str, out: str | os.PathLike[str]) -> list[str]:
        """``gpuflex job results --json``: write model, metrics and ledger into ``out``."""
        return list(self.call("job_results", {"job": job, "out": str(Path(out).resolve())})["files"])

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """``gpuflex job submit --json``: publish a validated spec; returns ``{"job_id", ...}``."""
        return dict(self.call("job_submit", {"spec": spec}))

    def events(self, since: int = 0) -> Iterator[dict[str, Any]]:
        """Yield the node's events, history first, until the connection ends."""
        self._sock.settimeout(None)
        self.call("events", {"since": since})
        for raw in self._file:
            msg = json.loads(raw)
            if "event" in msg:
                yield msg["event"]


def call(method: str, params: dict[str, Any] | None = None, home: str | os.PathLike[str] | None = None,
         timeout: float = 10.0) -> Any:
    """One-shot request to the node that owns ``home``."""
    with ControlClient.for_home(home, timeout=timeout) as client:
        return client.call(method, params)
