"""The wire fields of a time-budgeted round's work, and their bounds: a plan's budget and
per-member step counts, an update's claimed steps and device, a result's per-member work rows.

Every figure here is written by a peer (a coordinator for the plan and the result, a member
for its update), so each is checked or cut to its bound before anything weighs or shows it.
What the figures mean for training and aggregation is ``gpuflex.node.workplan``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from mesh.codec import WireError

#: A plan asks no member for more local steps than this, nor for a longer compute budget.
MAX_PLANNED_STEPS = 1_000_000
MAX_BUDGET_S = 86_400.0
#: Bytes of one encoded update a result may record (far above any model a node can hold).
MAX_UPDATE_BYTES = 1e13
#: A member's device description in its update is cut to this many characters.
DEVICE_CHARS = 64
HEX_DIGITS = "0123456789abcdef"
#: The per-member work figures a result's contributor rows carry, each with the bound a
#: reader holds it to.
WORK_BOUNDS: dict[str, float] = {"steps": MAX_PLANNED_STEPS, "compute_s": 1e6, "samples_per_s": 1e9,
                                 "compute_share": 1.0, "update_bytes": MAX_UPDATE_BYTES,
                                 "ahead_steps": MAX_PLANNED_STEPS}


def _number(value: object, high: float) -> TypeGuard[float]:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= high)


def plan_budget(body: Mapping[str, Any]) -> float:
    """A plan's ``budget_s`` (0.0 when absent: a round without a time budget)."""
    value = body.get("budget_s", 0.0)
    if not _number(value, MAX_BUDGET_S):
        raise WireError("garbled", f"plan field 'budget_s' must be a number of seconds in [0, {MAX_BUDGET_S:g}]")
    return float(value)


def planned_steps(body: Mapping[str, Any], members: Mapping[str, Any]) -> dict[str, int]:
    """Each member's step count in a time-budgeted plan: members of the plan only, bounded."""
    steps = body.get("steps", {})
    if not isinstance(steps, dict) or not all(
            isinstance(k, str) and k in members and isinstance(v, int) and not isinstance(v, bool)
            and 1 <= v <= MAX_PLANNED_STEPS for k, v in steps.items()):
        raise WireError("garbled", f"plan field 'steps' must map members to counts in [1, {MAX_PLANNED_STEPS}]")
    return dict(steps)


def claimed_steps(metrics: Mapping[str, Any]) -> int:
    """Local optimizer steps an update's metrics say it took (0 when they do not say)."""
    value = metrics.get("steps", 0)
    return int(value) if _number(value, MAX_PLANNED_STEPS) else 0


def update_device(body: Mapping[str, Any]) -> str:
    """What an update says it trained on, cut to ``DEVICE_CHARS`` (for people only)."""
    device = body.get("device")
    return device[:DEVICE_CHARS] if isinstance(device, str) else ""


def update_nonces(body: Mapping[str, Any]) -> tuple[str, str]:
    """The secure-aggregation nonce an update reveals and the commitment it makes to its next
    one (``gpuflex.node.placement.group_draw``): 32 bytes as lowercase hex each, else ""."""
    def hex32(value: object) -> str:
        return value if isinstance(value, str) and len(value) == 64 and not value.strip(HEX_DIGITS) else ""

    return hex32(body.get("nonce")), hex32(body.get("commit"))


def nonce_fields(body: Mapping[str, Any]) -> dict[str, str]:
    """An update's nonce and commitment as its result's contributor row records them."""
    nonce, commit = update_nonces(body)
    return {**({"nonce": nonce} if nonce else {}), **({"commit": commit} if commit else {})}


def contributor_work(row: Mapping[str, Any]) -> dict[str, Any]:
    """The work figures of one contributor row, as a coordinator wrote them: the device cut to
    ``DEVICE_CHARS`` printable characters, numbers finite and in bounds; anything else left out."""
    out: dict[str, Any] = {}
    device = row.get("device")
    if isinstance(device, str) and device:
        out["device"] = "".join(ch for ch in device[:DEVICE_CHARS] if ch.isprintable())
    for key, high in WORK_BOUNDS.items():
        value = row.get(key)
        if _number(value, high):
            out[key] = int(value) if key in ("steps", "update_bytes", "ahead_steps") else float(value)
    return out
