"""Small static charts as inline SVG, drawn on the server.

No charting library and no script: the portal's content security policy allows scripts only
from its own files, and a chart of fifty points does not need one. Colours come from the
stylesheet through class names (inline ``style`` attributes would break the policy). Every
chart has a title for screen readers, and each page also shows the same numbers in a table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

W, H = 320, 150
PAD_L, PAD_R, PAD_T, PAD_B = 40, 10, 12, 24


def _fmt(v: float) -> str:
    return f"{v:.3g}"


#: Markers are drawn for at most this many points; a longer series is a plain line (hundreds
#: of markers merge into a band that hides the curve).
MAX_MARKERS = 60
Y_TICKS = 5


def nice_ticks(lo: float, hi: float, count: int = Y_TICKS) -> list[float]:
    """About ``count`` evenly spaced round values (steps of 1, 2, 2.5 or 5 × 10^k) covering
    [lo, hi]: the first at or below ``lo``, the last at or above ``hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks = [first]
    while ticks[-1] < hi - 1e-9 * step and len(ticks) < 4 * count:
        ticks.append(ticks[-1] + step)
    return [round(t, 12) for t in ticks]


def _x_ticks(x0: float, x1: float) -> list[float]:
    """Whole rounds from first to last, a few in between on round numbers."""
    if x1 <= x0:
        return [x0]
    inner = [t for t in nice_ticks(x0, x1, 5) if x0 < t < x1 and t == int(t)]
    return [x0, *inner, x1]


def line_chart(points: Sequence[tuple[float, float]], *, title: str, series: str, caption: str,
               y_min: float | None = None, y_max: float | None = None) -> Markup:
    """One series over rounds: ``points`` are (round, value), drawn as a line (with markers
    while there are few points) on a y axis fitted to the data with round-numbered ticks and
    grid lines (``y_min``/``y_max`` bound it, e.g. 0 and 1 for an accuracy), in a figure whose
    visible caption is ``caption`` (``title`` is for screen readers)."""
    label = escape(title)
    if not points:
        return Markup('<p class="chart-empty">{} — no rounds yet</p>').format(escape(caption))
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    lo, hi = min(ys), max(ys)
    if hi - lo < 1e-9:
        pad = abs(hi) * 0.05 or 0.5
        lo, hi = lo - pad, hi + pad
    ticks = nice_ticks(lo, hi)
    lo, hi = ticks[0], ticks[-1]
    if y_min is not None and lo < y_min:
        ticks = [t for t in ticks if t >= y_min] or [y_min]
        lo = y_min
    if y_max is not None and hi > y_max:
        ticks = [t for t in ticks if t <= y_max] or [y_max]
        hi = y_max
    if hi - lo < 1e-12:
        hi = lo + 1.0
    x0, x1 = min(xs), max(xs)
    span_x = (x1 - x0) or 1.0

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / span_x * (W - PAD_L - PAD_R)

    def sy(y: float) -> float:
        return PAD_T + (hi - y) / (hi - lo) * (H - PAD_T - PAD_B)

    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5"/>' for x, y in points) \
        if len(points) <= MAX_MARKERS else ""
    grid = "".join(
        f'<line class="grid" x1="{PAD_L}" y1="{sy(t):.1f}" x2="{W - PAD_R}" y2="{sy(t):.1f}"/>'
        f'<text class="tick" x="{PAD_L - 4}" y="{sy(t) + 3:.1f}" text-anchor="end">{escape(_fmt(t))}</text>'
        for t in ticks)
    xt = _x_ticks(x0, x1)
    xlabels = "".join(
        f'<text class="tick" x="{sx(t):.1f}" y="{H - 6}" text-anchor="{anchor}">{t:.0f}</text>'
        for i, t in enumerate(xt)
        for anchor in ("start" if i == 0 else "end" if i == len(xt) - 1 else "middle",))
    last = points[-1]
    desc = f"{len(points)} rounds; latest: round {last[0]:.0f}, {_fmt(last[1])}"
    return Markup(
        '<figure class="chart-fig"><figcaption>{caption}</figcaption>'
        '<svg class="chart {series}" viewBox="0 0 {w} {h}" role="img" aria-label="{label}: {desc}">'
        "<title>{label}</title>{grid}"
        '<line class="axis" x1="{l}" y1="{t}" x2="{l}" y2="{b}"/>'
        '<line class="axis" x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>{xlabels}'
        '<polyline class="line" points="{coords}"/><g class="dots">{dots}</g></svg>'
        '<p class="chart-axis sub">round</p></figure>'
    ).format(caption=escape(caption), series=escape(series), w=W, h=H, label=label, desc=escape(desc), l=PAD_L,
             t=PAD_T, b=H - PAD_B, r=W - PAD_R, grid=Markup(grid), xlabels=Markup(xlabels), coords=coords,
             dots=Markup(dots))


def bar_chart(bars: Sequence[tuple[str, float, str]], *, title: str) -> Markup:
    """Horizontal bars: ``bars`` are (label, fraction 0..1, value text), one row each."""
    label = escape(title)
    if not bars:
        return Markup('<p class="chart-empty">{} — nothing recorded yet</p>').format(label)
    row, left, right = 22, 96, 70
    height = row * len(bars) + 6
    width = 360
    body = []
    # Scaled to the largest bar, so small shares stay visible; the value is printed beside.
    biggest = max(max(frac for _, frac, _ in bars), 1e-9)
    for i, (name, frac, value) in enumerate(bars):
        y = 4 + i * row
        length = max(0.0, min(1.0, frac / biggest)) * (width - left - right)
        body.append(Markup(
            '<text class="tick" x="{lx}" y="{ty}" text-anchor="end">{name}</text>'
            '<rect class="bar" x="{l}" y="{y}" width="{len:.1f}" height="{bh}"/>'
            '<text class="tick" x="{vx:.1f}" y="{ty}">{value}</text>'
        ).format(lx=left - 6, ty=y + 13, name=escape(name), l=left, y=y, len=length, bh=row - 8,
                 vx=left + length + 4, value=escape(value)))
    return Markup(
        '<svg class="chart bars" viewBox="0 0 {w} {h}" role="img" aria-label="{label}">'
        "<title>{label}</title>{body}</svg>"
    ).format(w=width, h=height, label=label, body=Markup("").join(body))
