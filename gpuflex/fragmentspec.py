"""Job-file rules of ``fragments`` (a fragment-wise outer sync, Streaming DiLoCo): what it
needs and what it cannot work with, each refused with the reason. No torch, no numpy: job
files validate fast (the split itself is ``aggregation.fragments``)."""

from __future__ import annotations

from typing import Any

#: At most this many fragments: each is synced once every ``fragments`` rounds, so more would
#: leave a fragment's outer step too rare to track the others.
MAX_FRAGMENTS = 64


def fragment_cross_checks(values: dict[str, Any]) -> list[tuple[str, str]]:
    """``fragments`` against the settings it cannot work with."""
    if values.get("fragments", 1) <= 1:
        return []
    errors: list[tuple[str, str]] = []
    if values.get("strategy", "fedavgm") != "diloco":
        errors.append(("fragments", "needs strategy = 'diloco': between a fragment's syncs members keep "
                       "training it on their own copy of the model, and DiLoCo's outer step is the one made "
                       "for many local steps (server_momentum = 0 with server_lr = 1 is plain averaging)"))
    if values.get("drift_correction") == "scaffold":
        errors.append(("fragments", "cannot be combined with drift_correction = 'scaffold': its control "
                       "variates correct every parameter every round, and a round syncs one fragment"))
    return errors
