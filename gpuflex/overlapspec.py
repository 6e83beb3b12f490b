"""Job-file rules of ``overlap`` (training ahead while an update travels): what it needs and
what it cannot work with, each refused with the reason. No torch, no numpy: job files
validate fast."""

from __future__ import annotations

from typing import Any

#: At least this share of every round's steps starts from the plan's base model.
MAX_OVERLAP = 0.9


def overlap_cross_checks(values: dict[str, Any]) -> list[tuple[str, str]]:
    """``overlap`` against the settings it cannot work with."""
    if not values.get("overlap", 0.0):
        return []
    errors: list[tuple[str, str]] = []
    if not values.get("local_steps", 0) and not values.get("compute_budget_s", 0.0):
        errors.append(("overlap", "needs local_steps or compute_budget_s: a member trains ahead a share "
                       "of a round's steps, which local_epochs does not fix in advance"))
    if values.get("train_fn"):
        errors.append(("overlap", "cannot be combined with train_fn: a plug-in's loop does not stop after "
                       "a given number of steps"))
    if values.get("drift_correction") == "scaffold":
        errors.append(("overlap", "cannot be combined with drift_correction = 'scaffold': steps trained "
                       "ahead would use the previous round's control variate"))
    return errors
