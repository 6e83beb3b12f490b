"""Job-file rules of time-budgeted rounds and FedNova: the settings they cannot work with.

Kept beside the job spec's own checks (``gpuflex.jobspec``), which call it with the values
that passed their field checks. No torch, no numpy: job files validate fast.
"""

from __future__ import annotations

from typing import Any


def budget_cross_checks(values: dict[str, Any]) -> list[tuple[str, str]]:
    """A compute budget and FedNova against the settings they cannot work with."""
    errors: list[tuple[str, str]] = []
    budget = values.get("compute_budget_s", 0.0)
    norm = values.get("normalization", "auto")
    fednova = norm == "fednova" or (norm == "auto" and budget > 0)
    if budget > 0 and values.get("train_fn"):
        errors.append(("compute_budget_s", "cannot be combined with train_fn: a plug-in runs its own "
                       "loop, which the budget cannot stop; set local_steps instead"))
    timeout = values.get("train_timeout_s", 0.0)
    if budget > 0 and 0 < timeout <= budget:
        errors.append(("train_timeout_s", f"must exceed compute_budget_s ({budget:g} s): members need "
                       "time to fetch the model and send their update after training"))
    why = "normalization = 'fednova' (the default under compute_budget_s)" if norm == "auto" \
        else "normalization = 'fednova'"
    if fednova and values.get("dp_clip", 0.0) > 0:
        errors.append(("normalization", f"{why} rescales each update by its step count, which the "
                       "privacy accounting of dp_clip does not cover; set normalization = 'none'"))
    if fednova and values.get("secure_aggregation"):
        errors.append(("normalization", f"{why} needs each update's step count at its leader, which "
                       "only sees the masked group sum; set normalization = 'none'"))
    return errors

