"""Shared CLI plumbing: one-line errors, JSON output, the --home option, and peer text.

What a node reports (job names, NodeInfo, errors quoting a spec) was partly written by other
machines, so the human-readable output prints such values through :func:`text`
(``gpuflex.safetext.printable``): no control character reaches the terminal.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, NoReturn

import typer

from gpuflex.safetext import SHORT_ID_CHARS, printable

HomeOpt = typer.Option(None, "--home", help="Node data directory (default: $GPUFLEX_HOME or ~/.gpuflex).")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON.")


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {printable(message, None, keep_newlines=True)}", err=True)
    raise typer.Exit(code)


def text(value: Any, limit: int | None = 200) -> str:
    """A value from the node, printable as it stands: control characters escaped, clipped."""
    return printable("-" if value is None else value, limit)


def number(value: Any, spec: str) -> str:
    """A figure from the node formatted with ``spec``; anything else (a peer's string where a
    number belongs) shows as '-' rather than failing the command."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    match = re.match(r"([<>^]?)(\d*)", spec)
    align, width = match.groups() if match else ("", "")
    return format("-", f"{align or '>'}{width}")


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


def short(peer: str | None, n: int = SHORT_ID_CHARS) -> str:
    return "-" if not peer else f"…{printable(str(peer)[-n:])}"


def ago(ts: float | None) -> str:
    import time

    if not ts:
        return "never"
    delta = max(0.0, time.time() - ts)
    return f"{delta:.0f}s ago" if delta < 120 else f"{delta / 60:.0f}m ago"


def human_bytes(n: float | None) -> str:
    if not n or not isinstance(n, (int, float)) or isinstance(n, bool):
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
        acc = accs[0] if isinstance(accs[0], dict) else {}
        dev = f"{text(acc.get('name', '?'), 60)} {human_bytes(acc.get('memory_bytes'))}"
        if info.get("legacy"):
            dev += " (legacy)"
    else:
        dev = "CPU only"
    return f"{dev}, {text(info.get('cpu_count', '?'), 8)} cpu, {human_bytes(info.get('ram_bytes'))} RAM"
