"""Job-file rules of client drift correction: the settings FedProx, SCAFFOLD and FedDyn cannot work with.

Kept beside the job spec's own checks (``gpuflex.jobspec``), which call it with the values
that passed their field checks. No torch, no numpy: job files validate fast.
"""

from __future__ import annotations

from typing import Any

from gpuflex.llmspec import is_llm


def drift_cross_checks(values: dict[str, Any]) -> list[tuple[str, str]]:
    """Drift correction against the settings it cannot work with, each with the reason."""
    kind = values.get("drift_correction", "none")
    errors: list[tuple[str, str]] = []
    if kind == "none":
        return errors
    if values.get("train_fn"):
        errors.append(("drift_correction", "cannot be combined with train_fn: the correction acts "
                       "on the gradients of GPUFlex's own training loop, which a plug-in replaces"))
    if is_llm(values.get("model")):
        errors.append(("drift_correction", "is for the classic models; language-model jobs train "
                       "with their own loop"))
    if kind == "feddyn" and values.get("strategy", "fedavgm") != "fedavg":
        errors.append(("drift_correction", "'feddyn' needs strategy = 'fedavg': its server step already "
                       "adds the running sum of every averaged delta (a momentum of 1), which a "
                       "second server optimizer would compound"))
    if kind == "feddyn" and values.get("dp_noise_multiplier", 0.0) > 0:
        errors.append(("drift_correction", "'feddyn' cannot be combined with dp_noise_multiplier > 0: its "
                       "server step adds the sum of every round's averaged delta, so the noise of "
                       "all rounds would pile up in each step"))
    if kind != "scaffold":
        return errors
    if values.get("dp_noise_multiplier", 0.0) > 0:
        errors.append(("drift_correction", "'scaffold' cannot be combined with dp_noise_multiplier > 0: the "
                       "server's control variate adds every round's averaged control delta, so the noise "
                       "of all rounds would pile up in the correction each member applies"))
    if values.get("codec", "none") == "topk":
        errors.append(("codec", "'topk' cannot be combined with drift_correction = 'scaffold': its control "
                       "variates must reach the root whole, and top-k would keep only a fraction of them"))
    budget = values.get("compute_budget_s", 0.0)
    norm = values.get("normalization", "auto")
    if norm == "fednova" or (norm == "auto" and budget > 0):
        why = "normalization = 'fednova' (the default under compute_budget_s)" if norm == "auto" \
            else "normalization = 'fednova'"
        errors.append(("drift_correction", f"'scaffold' cannot be combined with {why}: FedNova "
                       "rescales the whole update, control variates included; set normalization = 'none'"))
    return errors
