"""Which committed model a job hands its user: the best round's or the last one's.

Under skewed data the last round can be clearly worse than an earlier one (a round whose
members were mostly of one class), and the user would get it. The root scores every new
model on the held-out split and signs the score into its result, so every node can pick the
same best round from its ledger alone, at no cost. The score is the committing root's claim:
a hostile root can overstate it to have its round chosen, but not change the model it names,
which every node checked against the signed updates (docs/security.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gpuflex.node.core.messages import Result


def score(metrics: dict[str, Any]) -> float | None:
    """Higher is better: the accuracy where the job has one, else minus the loss."""
    for key, sign in (("accuracy", 1.0), ("loss", -1.0)):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return sign * float(value)
    return None


def best_result(results: Sequence[Result]) -> Result | None:
    """The committed round with the highest score (the later one on a tie), or None when no
    round was scored."""
    best: tuple[float, int] | None = None
    chosen: Result | None = None
    for res in results:
        s = score(res.metrics)
        if s is not None and (best is None or (s, res.round) >= best):
            best, chosen = (s, res.round), res
    return chosen


def selected_result(final_model: str, results: Sequence[Result]) -> Result | None:
    """The result whose model ``model.pt`` is: per the job's ``final_model``."""
    if not results:
        return None
    if final_model == "best":
        return best_result(results) or results[-1]
    return results[-1]
