"""Shared CLI plumbing: one-line errors, JSON output, and the --home option."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer

HomeOpt = typer.Option(None, "--home", help="Node data directory (default: $GPUFLEX_HOME or ~/.gpuflex).")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON.")


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def call_node(method: str, params: dict[str, Any] | None = None, home: str | None = None,
              timeout: float = 10.0) -> Any:
    """Ask the node that owns ``home``; any failure becomes a one-line error."""
    from gpuflex.client import ControlError, call

    try:
        return call(method, params, home=home, timeout=timeout)
    except ControlError as exc:
        fail(str(exc))


def short(peer: str | None, n: int = 10) -> str:
    return "-" if not peer else f"…{peer[-n:]}"


def ago(ts: float | None) -> str:
    import time

    if not ts:
        return "never"
    delta = max(0.0, time.time() - ts)
    return f"{delta:.0f}s ago" if delta < 120 else f"{delta / 60:.0f}m ago"


def human_bytes(n: float | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} PiB"


def hardware_summary(info: dict[str, Any] | None) -> str:
    if not info:
        return "-"
    accs = info.get("accelerators") or []
    if accs:
        acc = accs[0]
        dev = f"{acc.get('name', '?')} {human_bytes(acc.get('memory_bytes'))}"
        if info.get("legacy"):
            dev += " (legacy)"
    else:
        dev = "CPU only"
    return f"{dev}, {info.get('cpu_count', '?')} cpu, {human_bytes(info.get('ram_bytes'))} RAM"
