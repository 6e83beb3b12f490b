"""How much local work each member does in a time-budgeted round, and how it is weighed.

A job with ``compute_budget_s`` gives every member the same number of seconds, not the same
number of steps: a fast node does more steps and a slow one fewer, and the round lasts as long
as the budget instead of as long as its slowest member. The coordinator turns each member's
published throughput (samples per second, measured on its own device for this job's model)
into a step count, the most it may take: what its throughput fits in the budget, with headroom.
The member's own time stop ends its training at the budget, so a fast node always trains for
the whole budget, even when it was busier while its throughput was measured; the count bounds
what it may claim (FedNova weighs updates by it), and a wrong estimate costs at most one step
of overshoot.

A member much slower than the others (``slow_members``) is neither a leader nor the root
when a faster one can be: everything it does is slow, and the round would wait for it.

Members' updates then carry unequal work, which FedNova undoes (``aggregation.fednova``):
each update is divided by its step norm at its leader, and the root scales the mean by the
sample-weighted mean norm. Each update weighs the samples its member saw this round (steps x
batch): a direction measured over three batches must not count as much as one measured over
thirty, or a slow member would pull every round back toward its base model. The step counts
a member claims are bounded by its plan, and its samples by its steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from aggregation.errors import AggregationError
from aggregation.fednova import effective_norm, normalise, step_norm
from aggregation.sparse import SparseVector
from gpuflex.node.messages import Plan, Update
from gpuflex.node.workfields import MAX_PLANNED_STEPS, MAX_UPDATE_BYTES
from mesh.codec import WireError

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec

#: A plan allows this many times the steps a member's measured throughput fits in the budget.
#: Throughput on a shared machine drifts by a third between rounds; a count that ended
#: inside the budget at the measured rate left fast members idle for a quarter of it. The
#: member's time stop, not the count, ends its training.
STEP_HEADROOM = 1.5
#: A member whose throughput is below this share of the fastest member's is slow: it is
#: placed as a leaf, never a leader, and does not coordinate while a faster member can.
SLOW_SHARE = 0.25
#: A published throughput above this (samples per second) is not believed.
MAX_RATE = 1e9
#: A fresh measurement counts this much against the running estimate (an EMA): a node whose
#: load changes is planned right within two rounds, one noisy round does not swing it.
RATE_WEIGHT = 0.5
#: Momentum of the job's "momentum" optimizer (gpuflex.ml.train.make_optimizer): FedNova's
#: step norm depends on it.
SGD_MOMENTUM = 0.9


def valid_rate(value: object) -> float | None:
    """A peer's published throughput if it is a plausible number, else None (unknown)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    rate = float(value)
    return rate if math.isfinite(rate) and 0 < rate <= MAX_RATE else None


def blend(old: float | None, measured: float) -> float:
    """The running throughput after one more measurement."""
    if valid_rate(measured) is None:
        return old or 0.0
    return measured if not old else (1 - RATE_WEIGHT) * old + RATE_WEIGHT * measured


def plan_steps(members: Sequence[str], rates: Mapping[str, float], budget_s: float, batch_size: int,
               cap: int = 0) -> dict[str, int]:
    """Each member's local step count for a round of ``budget_s`` seconds.

    A member with a known throughput gets ``STEP_HEADROOM`` times the whole steps of
    ``batch_size`` samples that fit in the budget, and at least one: a member too slow for
    even one step in the budget still trains one and counts. A member whose throughput is unknown (not yet
    published, or zero) gets the largest count planned for anyone, which its own time stop
    cuts to what it can do. ``cap`` (the job's ``local_steps``, if set) bounds every count.
    """
    limit = min(cap, MAX_PLANNED_STEPS) if cap > 0 else MAX_PLANNED_STEPS
    counts: dict[str, int] = {}
    for peer in members:
        rate = valid_rate(rates.get(peer))
        if rate is not None:
            fits = math.floor(budget_s * STEP_HEADROOM * rate / max(1, batch_size) + 1e-9)
            counts[peer] = max(1, min(limit, fits))
    unknown = max(counts.values()) if counts else limit
    return {peer: counts.get(peer, unknown) for peer in members}


def slow_members(rates: Mapping[str, object]) -> set[str]:
    """The members whose throughput is below ``SLOW_SHARE`` of the fastest one's (members with
    no valid throughput are not judged)."""
    valid = {peer: rate for peer, value in rates.items() if (rate := valid_rate(value)) is not None}
    if len(valid) < 2:
        return set()
    fastest = max(valid.values())
    return {peer for peer, rate in valid.items() if rate < SLOW_SHARE * fastest}


def recorded_rates(contributors: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """Each contributor's throughput as a committed result records it (``member_work``): the
    same on every node that holds the ledger, so decisions made from it agree without messages."""
    return {str(c["peer"]): c.get("samples_per_s") for c in contributors if isinstance(c.get("peer"), str)}


def keep_earlier(counts: dict[str, int], earlier: Sequence[Plan], base_hash: str) -> dict[str, int]:
    """``counts`` with each member raised to its steps in any earlier attempt's plan of this
    round on the same base model: a member that already trained re-sends that update to the
    new attempt, and its step count must stay within what the new plan allows."""
    out = dict(counts)
    for plan in earlier:
        if plan.base_hash != base_hash:
            continue
        for peer, steps in plan.steps.items():
            if peer in out:
                out[peer] = max(out[peer], steps)
    return out


def fits_plan(plan: Plan, me: str, steps: int) -> bool:
    """Whether an update of ``steps`` local steps is within ``plan``'s allowance for ``me``."""
    return plan.budget_s <= 0 or steps <= plan.steps.get(me, MAX_PLANNED_STEPS)


def local_work(plan: Plan, me: str) -> tuple[int, float]:
    """(most steps, seconds) this member trains under ``plan``; (0, 0.0) for a plan without a
    budget, where the job's epochs or steps decide."""
    if plan.budget_s <= 0:
        return 0, 0.0
    return plan.steps.get(me, 0), plan.budget_s


# -- FedNova in the round --------------------------------------------------------------------


def norm_of(spec: JobSpec, steps: int) -> float:
    """FedNova's step norm ``a_i`` of a member that took ``steps`` local steps of the job's optimizer."""
    momentum = SGD_MOMENTUM if spec.optimizer == "momentum" else 0.0
    return step_norm(steps, momentum)


def checked_steps(spec: JobSpec, plan: Plan, up: Update) -> int:
    """The update's local step count, which FedNova weighs it by: present, and no more than
    its plan allowed (a member that claimed more would scale everyone's update)."""
    steps = up.steps
    if steps < 1:
        raise WireError("garbled", f"update from {up.peer[-8:]} does not say how many local steps it took")
    bound = plan.steps.get(up.peer) or spec.local_steps or MAX_PLANNED_STEPS
    if steps > bound:
        raise WireError("round", f"update from {up.peer[-8:]} claims {steps} local steps, its plan allows {bound}")
    if up.samples > steps * spec.batch_size:  # its weight: the samples it saw, one batch a step
        raise WireError("round", f"update from {up.peer[-8:]} claims {up.samples} samples seen in {steps} "
                                 f"steps of {spec.batch_size}")
    return steps


def fold_vector(spec: JobSpec, plan: Plan, up: Update, vector: np.ndarray) -> np.ndarray:
    """What a leader folds for ``up``: its delta, divided by its step norm under FedNova."""
    if not spec.uses_fednova:
        return vector
    norm = norm_of(spec, checked_steps(spec, plan, up))
    if isinstance(vector, SparseVector):
        return SparseVector(vector.size, vector.index, normalise(vector.values, norm))  # type: ignore[return-value]
    return normalise(vector, norm)


def effective_steps_norm(spec: JobSpec, plan: Plan, updates: Sequence[Update]) -> float:
    """``τ_eff`` of a round's contributions: their sample-weighted mean step norm, or with a
    robust rule (each input counts once, whatever it claims) the median norm."""
    norms = [norm_of(spec, checked_steps(spec, plan, u)) for u in updates]
    if spec.rule != "mean":
        ordered = sorted(norms)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    try:
        return effective_norm([float(u.samples) for u in updates], norms)
    except AggregationError as exc:
        raise WireError("round", f"cannot weigh the round's updates: {exc}") from None


def _figure(metrics: Mapping[str, object], key: str, high: float) -> float:
    value = metrics.get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok and 0 <= value <= high else 0.0  # type: ignore[operator, arg-type]


def member_work(updates: Sequence[Update]) -> dict[str, dict[str, object]]:
    """Per contributor, what the round's result records of its work: its device, the local
    steps it took, its training seconds and throughput, its share of the round's compute
    (its seconds over everyone's) and the bytes of its encoded update (as it signed them)."""
    seconds = {u.peer: _figure(u.metrics, "seconds", 1e6) for u in updates}
    total = sum(seconds.values())
    rows: dict[str, dict[str, object]] = {}
    for u in updates:
        rows[u.peer] = {"device": u.device, "steps": u.steps, "compute_s": round(seconds[u.peer], 3),
                        "samples_per_s": round(_figure(u.metrics, "samples_per_s", MAX_RATE), 1),
                        "update_bytes": int(_figure(u.metrics, "update_bytes", MAX_UPDATE_BYTES)),
                        "compute_share": round(seconds[u.peer] / total, 4) if total > 0 else 0.0}
        # Steps trained ahead while the previous update travelled (job option ``overlap``); only
        # when there were some, so a result without overlap is written as before.
        if ahead := min(u.steps, int(_figure(u.metrics, "ahead_steps", u.steps))):
            rows[u.peer]["ahead_steps"] = ahead
    return rows
