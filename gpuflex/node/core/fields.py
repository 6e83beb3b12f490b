"""Reading one field of a signed message's body, checked: the type, and for counts the range.

Every parser in ``messages`` goes through these, so a malformed body becomes a ``WireError``
(logged, dropped, penalised) at the field that is wrong, named in the reason.
"""

from __future__ import annotations

import math
from typing import Any

from mesh.codec import WireError, WireReason


def read_field(body: Any, name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(body, dict) or name not in body:
        raise WireError(WireReason.GARBLED, f"{what} lacks field {name!r}")
    value = body[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        raise WireError(WireReason.GARBLED, f"{what} field {name!r} has the wrong type")
    return value


def read_strs(body: Any, name: str, what: str) -> tuple[str, ...]:
    items = read_field(body, name, list, what)
    if not all(isinstance(x, str) for x in items):
        raise WireError(WireReason.GARBLED, f"{what} field {name!r} must be a list of strings")
    return tuple(items)


def read_count(body: Any, name: str, what: str, low: int, high: int) -> int:
    value = read_field(body, name, int, what)
    if not low <= value <= high:
        raise WireError(WireReason.GARBLED, f"{what} field {name!r} is {value}, outside [{low}, {high}]")
    return int(value)


def read_finite(body: Any, name: str, what: str) -> float:
    value = float(read_field(body, name, (int, float), what))
    if not math.isfinite(value):
        raise WireError(WireReason.GARBLED, f"{what} field {name!r} is not a finite number")
    return value


def read_frames(body: Any, name: str, what: str) -> list[bytes]:
    items = read_field(body, name, list, what)
    if not all(isinstance(x, bytes) for x in items):
        raise WireError(WireReason.GARBLED, f"{what} field {name!r} must be a list of frames")
    return list(items)
