"""Small static charts as inline SVG, drawn on the server.

No charting library and no script: the portal's content security policy allows scripts only
from its own files, and a chart of fifty points does not need one. Colours come from the
stylesheet through class names (inline ``style`` attributes would break the policy). Every
chart has a title for screen readers, and each page also shows the same numbers in a table.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

W, H = 320, 150
PAD_L, PAD_R, PAD_T, PAD_B = 40, 10, 12, 24


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def line_chart(points: Sequence[tuple[float, float]], *, title: str, series: str, caption: str,
               y_min: float | None = None, y_max: float | None = None) -> Markup:
    """One series over rounds: ``points`` are (round, value), drawn as a line with markers,
    in a figure whose visible caption is ``caption`` (``title`` is for screen readers)."""
    label = escape(title)
    if not points:
        return Markup('<p class="chart-empty">{} — no rounds yet</p>').format(escape(caption))
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    lo = min(ys) if y_min is None else y_min
    hi = max(ys) if y_max is None else y_max
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    x0, x1 = min(xs), max(xs)
    span_x = (x1 - x0) or 1.0

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / span_x * (W - PAD_L - PAD_R)

    def sy(y: float) -> float:
        return PAD_T + (hi - y) / (hi - lo) * (H - PAD_T - PAD_B)

    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5"/>' for x, y in points[-60:])
    last = points[-1]
    desc = f"{len(points)} rounds; latest: round {last[0]:.0f}, {_fmt(last[1])}"
    return Markup(
        '<figure class="chart-fig"><figcaption>{caption}</figcaption>'
        '<svg class="chart {series}" viewBox="0 0 {w} {h}" role="img" aria-label="{label}: {desc}">'
        "<title>{label}</title>"
        '<line class="axis" x1="{l}" y1="{t}" x2="{l}" y2="{b}"/>'
        '<line class="axis" x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>'
        '<text class="tick" x="{lx}" y="{ty}" text-anchor="end">{hi}</text>'
        '<text class="tick" x="{lx}" y="{by}" text-anchor="end">{lo}</text>'
        '<text class="tick" x="{l}" y="{xy}" text-anchor="start">round {x0}</text>'
        '<text class="tick" x="{r}" y="{xy}" text-anchor="end">round {x1}</text>'
        '<polyline class="line" points="{coords}"/><g class="dots">{dots}</g></svg></figure>'
    ).format(caption=escape(caption), series=escape(series), w=W, h=H, label=label, desc=escape(desc), l=PAD_L, t=PAD_T,
             b=H - PAD_B, r=W - PAD_R, lx=PAD_L - 4, ty=PAD_T + 8, by=H - PAD_B, hi=_fmt(hi),
             lo=_fmt(lo), xy=H - 6, x0=f"{x0:.0f}", x1=f"{x1:.0f}", coords=coords, dots=Markup(dots))


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
