"""The Join page's QR code of the bootstrap address, drawn in Python as inline SVG.

segno is pure Python with no dependencies, and its SVG uses presentation attributes only (no
inline style), so the code passes the portal's content security policy and needs no network.
"""

from __future__ import annotations

import segno
from markupsafe import Markup

MAX_QR_TEXT = 1000


def qr_svg(text: str, title: str = "QR code of the bootstrap address") -> Markup:
    """``text`` as a QR code (error correction M), scaled by CSS through its viewBox."""
    code = segno.make(text[:MAX_QR_TEXT], error="m", micro=False)
    # segno escapes the title; the SVG is its own output, built from bits, never from text.
    return Markup(code.svg_inline(scale=4, omitsize=True, svgclass="qr", lineclass="qr-dark",
                                  title=title, dark="#000", light="#fff", border=4))
