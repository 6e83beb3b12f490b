"""The blocking adapter of the control-API client (see docs/control-api.md and core.py).

The CLI's query commands must start in well under a second, so this module uses only the
standard library: no trio, no libp2p, no torch.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuflex.client.core import (
    MAX_LINE,
    Endpoint,
    Unreachable,
    encode_request,
    event_of,
    parse_line,
    result_of,
)
from gpuflex.client.files import locate


class ControlClient:
    """One connection to a node; requests are answered in order."""

    def __init__(self, endpoint: Endpoint, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        try:
            self._sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        except OSError as exc:
            raise Unreachable(
                f"no node answers for home {endpoint.home} at {endpoint.host}:{endpoint.port} ({exc.strerror or exc})"
            ) from None
        self._file = self._sock.makefile("rwb")

    @classmethod
    def for_home(cls, home: str | os.PathLike[str] | None = None, timeout: float = 10.0) -> ControlClient:
        return cls(locate(home), timeout=timeout)

    def close(self) -> None:
        """Close the connection; a node that has already gone (it was told to stop, and its
        process exits at once) leaves nothing to flush, so that is no error."""
        try:
            with contextlib.suppress(OSError):
                self._file.close()
        finally:
            self._sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, params: dict[str, Any] | None) -> None:
        try:
            self._file.write(encode_request(self.endpoint.token, method, params))
            self._file.flush()
        except OSError as exc:  # reset or broken pipe: the node went away, as for a read
            raise Unreachable(f"the node closed the connection: {exc.strerror or exc}") from None

    def _recv(self) -> Any:
        try:
            raw = self._file.readline(MAX_LINE + 1)
        except (TimeoutError, OSError) as exc:
            raise Unreachable(f"the node did not answer: {exc}") from None
        if not raw:
            raise Unreachable("the node closed the connection")
        return result_of(parse_line(raw))

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
            event = event_of(parse_line(raw))
            if event is not None:
                yield event


def call(method: str, params: dict[str, Any] | None = None, home: str | os.PathLike[str] | None = None,
         timeout: float = 10.0) -> Any:
    """One-shot request to the node that owns ``home``."""
    with ControlClient.for_home(home, timeout=timeout) as client:
        return client.call(method, params)
