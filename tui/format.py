"""Turning wire values into short cell text.

Every screen shares these so a peer id, a duration or a byte count reads the same
everywhere; they are pure functions of their arguments (the clock is passed in) so that
snapshots are stable.

Text that came from another machine (a job's name, a peer's NodeInfo, an event's message)
goes on screen through :func:`literal` and nothing else: Rich and Textual read ``[...]`` in a
plain string as markup, so ``[/evil]`` would crash a screen and ``[link=...]`` would forge a
link, and a terminal obeys the control characters in it.
"""

from __future__ import annotations

import time

from rich.text import Text

from gpuflex.safetext import printable

LIBP2P_PREFIX = "12D3KooW"
"""Every Ed25519 libp2p id starts with this, so it carries no information on screen."""

STATE_STYLES = {"up": "green", "suspect": "yellow", "down": "red"}
REACH_STYLES = {"public": "green", "relayed": "cyan", "private": "yellow", "unknown": "dim"}
JOB_STATE_STYLES = {"running": "cyan", "done": "green", "failed": "red", "pending": "yellow"}
DASH = "–"
MAX_TEXT = 200
"""Characters of one piece of peer text on screen; a job name is bounded at 200 as well."""
def literal(value: object, style: str = "") -> Text:
    """Untrusted text exactly as it reads: no markup, control characters escaped, clipped."""
    return Text(printable(value, MAX_TEXT), style=style)


def short_id(peer_id: str | None, head: int = 4, tail: int = 4) -> str:
    """Drop the shared prefix and keep both ends: people match ids by their first and last
    characters, and the ends are what differ between peers."""
    if not peer_id:
        return DASH
    rest = peer_id[len(LIBP2P_PREFIX) :] if peer_id.startswith(LIBP2P_PREFIX) else peer_id
    if len(rest) <= head + tail + 1:
        return rest
    return f"{rest[:head]}…{rest[-tail:]}"


def short_hash(value: str | None, length: int = 10) -> str:
    """Hashes are compared by eye; a fixed prefix is enough to tell rounds apart."""
    if not value:
        return DASH
    return value if len(value) <= length else value[:length] + "…"


def human_bytes(n: float | None) -> str:
    """Binary units with one significant decimal, as nvtop and btop print memory."""
    if n is None:
        return DASH
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            if unit == "B":
                return f"{int(value)}B"
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
        value /= 1024
    return f"{value:.0f}T"  # pragma: no cover - loop always returns


def human_duration(seconds: float | None) -> str:
    """Two units at most: '3s', '4m12s', '2h05m', '3d4h' fit a narrow column."""
    if seconds is None:
        return DASH
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def ago(ts: float | None, now: float) -> str:
    """Relative age of a timestamp; absolute times mean little across hosts and tunnels."""
    if ts is None:
        return DASH
    return human_duration(now - ts)


def clock_time(ts: float | None) -> str:
    """Wall-clock time of day in the viewer's zone, for the event log."""
    if ts is None:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(ts))


def rtt(ms: float | None) -> str:
    """Sub-millisecond loopback RTTs keep a decimal; WAN RTTs do not need one."""
    if ms is None:
        return DASH
    return f"{ms:.1f}ms" if ms < 10 else f"{ms:.0f}ms"


def number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return DASH
    return f"{value:.{digits}f}"


def percent(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value * 100:.1f}%"


def device_name(name: str) -> str:
    """Vendor words take half a column and say nothing the kind does not."""
    for noise in ("NVIDIA ", "GeForce ", "AMD ", "Radeon ", "Apple "):
        name = name.replace(noise, "")
    return name.strip()
