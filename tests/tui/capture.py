"""Plain-text captures of what the dashboard draws, for snapshot tests and for reading.

Text rather than SVG: a diff of two text captures shows at once what moved, and it does
not depend on the SVG exporter's styling. Colour is checked by the pilot tests instead.
"""

from __future__ import annotations

import io

from rich.console import Console
from textual.app import App


def screen_text(app: App[object]) -> str:
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    )
    lines = console.export_text(styles=False).splitlines()
    return "\n".join(line.rstrip() for line in lines) + "\n"
