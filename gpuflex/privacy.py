"""The privacy budget of client-side DP: ε at the job's δ after r rounds (RDP accountant).

Every selected member clips its update to ``dp_clip`` and adds Gaussian noise of std
``dp_noise_multiplier * dp_clip`` (see gpuflex/node/core/pipeline.py), so each round is one Gaussian
mechanism with noise multiplier z and sampling rate 1 for every member, whatever the others do.
The guarantee is per member (user-level: neighbouring data sets differ in one member's whole
data). Composition over rounds is tracked in Rényi DP (Mironov 2017) by Google's
``dp-accounting``, and ε depends only on the spec and the round count, so any node, the CLI
and an auditor all compute the same figure without exchanging anything.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

from mesh.compat import StrEnum

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec


class BudgetStatus(StrEnum):
    """Whether the next round may run within a job's privacy budget (``budget_status``)."""

    OK = "ok"  # within the budget, or no budget
    WARN = "warn"  # past it; the job's ``dp_on_budget`` says to go on and say so
    STOP = "stop"  # past it; the job stops before the round


OK, WARN, STOP = BudgetStatus.OK, BudgetStatus.WARN, BudgetStatus.STOP


@lru_cache(maxsize=1024)
def epsilon_for(noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε after ``rounds`` Gaussian mechanisms of multiplier z, at ``delta``; inf without noise."""
    if rounds <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    # Imported here: dp-accounting pulls in SciPy, seconds of start-up that a node whose jobs
    # use no DP (and every query command) should not pay.
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), int(rounds))
    return float(accountant.get_epsilon(delta))


def epsilon_spent(spec: JobSpec, rounds: int) -> float:
    """ε spent by a member that took part in ``rounds`` rounds of this job (inf if DP is off)."""
    return epsilon_for(spec.dp_noise_multiplier if spec.uses_dp else 0.0, rounds, spec.dp_delta)


def budget_status(spec: JobSpec, rounds_done: int) -> BudgetStatus:
    """OK, or what the job's ``dp_on_budget`` says to do before the next round.

    The check looks one round ahead: a round that would take ε past the budget is the one
    not to run, since its noise cannot be taken back once the update is sent.
    """
    if not spec.uses_dp or spec.dp_epsilon_budget <= 0:
        return OK
    if epsilon_spent(spec, rounds_done + 1) <= spec.dp_epsilon_budget:
        return OK
    return STOP if spec.dp_on_budget == "stop" else WARN


def noise_for_epsilon(epsilon: float, rounds: int, delta: float = 1e-5) -> float:
    """Smallest noise multiplier whose ε after ``rounds`` stays within ``epsilon`` (bisection)."""
    if epsilon <= 0 or rounds <= 0:
        raise ValueError("epsilon and rounds must be positive")
    low, high = 0.05, 1.0
    while epsilon_for(high, rounds, delta) > epsilon:
        low, high = high, high * 2
        if high > 1e4:
            raise ValueError(f"no noise multiplier reaches ε={epsilon} in {rounds} rounds")
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if epsilon_for(mid, rounds, delta) > epsilon else (low, mid)
    return math.ceil(high * 1e4) / 1e4
