"""Template filters: how numbers, times and ids read on a page.

A missing value is always an em dash, never "None" or "nan", so a field an older node does not
send reads as absent rather than broken.
"""

from __future__ import annotations

import time

from jinja2 import Environment

from gpuflex_web.model import human_bytes, short
from gpuflex_web.spectext import spec_toml

DASH = "—"


def dash(value: object) -> object:
    return DASH if value is None or value == "" else value


def fixed(value: float | None, digits: int = 3) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def pct(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value * 100:.{digits}f}%"


def ms(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


def _span(seconds: float, units: tuple[tuple[float, str], ...]) -> str:
    """``seconds`` in the first unit whose limit it is under: (limit, "unit") pairs, seconds."""
    for limit, unit in units:
        if seconds < limit:
            size = {"s": 1, "min": 60, "h": 3600}[unit]
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / 3600:.0f} h"


def ago(ts: float | None, now: float) -> str:
    if not ts:
        return "never"
    delta = max(0.0, now - ts)
    return "just now" if delta < 2 else _span(delta, ((120, "s"), (7200, "min"))) + " ago"


def clock(ts: float | None) -> str:
    return DASH if not ts else time.strftime("%H:%M:%S", time.localtime(ts))


def duration(seconds: float | None) -> str:
    return DASH if seconds is None else _span(max(0.0, seconds), ((120, "s"), (7200, "min")))


def yesno(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def install(env: Environment) -> None:
    env.filters.update(dash=dash, fixed=fixed, pct=pct, ms=ms, ago=ago, clock=clock,
                       duration=duration, yesno=yesno, short=short, toml=spec_toml, bytes=human_bytes)
