"""A job's spec as the job file it came from would read: TOML, not Python or JSON.

The job page shows the spec near its top so a reader sees at once what the job trains and
how. A value is the publisher's text, so strings are written as TOML basic strings (quotes and
control characters escaped) and the page escapes the whole again as HTML.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 4


def toml_value(value: Any, depth: int = 0) -> str:
    """One value in TOML's inline syntax (true, 0.1, "text", [1, 2], { a = 1 })."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if value != value else ("inf" if value > 0 else "-inf"))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if depth >= MAX_DEPTH:
        return '"…"'
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(k)} = {toml_value(v, depth + 1)}" for k, v in value.items() if v is not None)
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v, depth + 1) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def _key(key: Any) -> str:
    text = str(key)
    return text if text and all(c.isalnum() or c in "_-" for c in text) else json.dumps(text, ensure_ascii=False)


def spec_toml(spec: Mapping[str, Any]) -> str:
    """The spec as a job file: its plain keys first, then each table (``[llm]``) after them.
    Unset keys (None) are left out: TOML has no null, and a job file would not name them."""
    lines = [f"{_key(k)} = {toml_value(v)}" for k, v in spec.items()
             if v is not None and not isinstance(v, Mapping)]
    for key, table in spec.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{_key(key)}]"]
            lines += [f"{_key(k)} = {toml_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines)
