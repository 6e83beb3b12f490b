"""The step planner of time-budgeted rounds, and how FedNova reads the members' claims."""

from __future__ import annotations

import math

import pytest

from gpuflex.node.workfields import MAX_PLANNED_STEPS
from gpuflex.node.workplan import FILL, blend, local_work, member_work, plan_steps, valid_rate

A, B, C = "peer-a", "peer-b", "peer-c"


def test_steps_fill_the_budget_at_each_members_throughput() -> None:
    # 10 s budget, batches of 32: 320 samples/s fits 100 steps at full fill, 95 at FILL = 0.95.
    steps = plan_steps([A, B], {A: 320.0, B: 32.0}, budget_s=10.0, batch_size=32)
    assert FILL == 0.95
    assert steps == {A: 95, B: 9}  # 9.5 rounds down: the plan ends inside the budget
    for peer, rate in ((A, 320.0), (B, 32.0)):
        assert steps[peer] * 32 / rate <= 10.0


def test_rounding_is_down_and_exact_multiples_are_kept() -> None:
    # 40 samples/s * 0.95 * 20 s / 19 per batch = 40 steps exactly (float error must not drop one)
    assert plan_steps([A], {A: 40.0}, budget_s=20.0, batch_size=19) == {A: 40}
    assert plan_steps([A], {A: 41.0}, budget_s=20.0, batch_size=19) == {A: 41}  # 41.0 exactly
    assert plan_steps([A], {A: 40.9}, budget_s=20.0, batch_size=19) == {A: 40}  # 40.9 -> 40


def test_a_member_too_slow_for_one_step_still_gets_one() -> None:
    assert plan_steps([A, B], {A: 1000.0, B: 0.5}, budget_s=5.0, batch_size=64) == {A: 74, B: 1}


def test_zero_or_unknown_throughput_gets_the_largest_count_and_its_time_stop_cuts_it() -> None:
    steps = plan_steps([A, B, C], {A: 64.0, B: 0.0}, budget_s=10.0, batch_size=32)
    assert steps == {A: 19, B: 19, C: 19}
    # Nobody measured yet: the cap (the job's local_steps) or the wire limit.
    assert plan_steps([A, B], {}, budget_s=10.0, batch_size=32, cap=50) == {A: 50, B: 50}
    assert plan_steps([A], {A: float("nan")}, budget_s=10.0, batch_size=32) == {A: MAX_PLANNED_STEPS}


def test_the_jobs_local_steps_caps_every_count() -> None:
    assert plan_steps([A, B], {A: 1e6, B: 10.0}, budget_s=10.0, batch_size=10, cap=25) == {A: 25, B: 9}


def test_a_member_that_overshoots_is_planned_fewer_steps_next_round() -> None:
    # Planned 95 steps at 320 samples/s; it really ran at 160 (load from elsewhere): 19 s, not 10.
    rate = 320.0
    first = plan_steps([A], {A: rate}, 10.0, 32)[A]
    measured = first * 32 / 19.0
    rate = blend(rate, measured)
    second = plan_steps([A], {A: rate}, 10.0, 32)[A]
    assert second < first
    rate = blend(rate, measured)
    third = plan_steps([A], {A: rate}, 10.0, 32)[A]
    assert third < second and third * 32 / measured <= 10.0 * 1.3  # converging on the budget


def test_blend_ignores_bad_measurements() -> None:
    assert blend(None, 100.0) == 100.0
    assert blend(100.0, 50.0) == 75.0
    assert blend(100.0, math.inf) == 100.0
    assert blend(None, -1.0) == 0.0


@pytest.mark.parametrize("value", [None, True, "fast", -1.0, 0.0, math.nan, math.inf, 2e9])
def test_implausible_rates_are_unknown(value: object) -> None:
    assert valid_rate(value) is None


def test_member_work_shares_the_rounds_compute() -> None:
    from types import SimpleNamespace

    ups = [SimpleNamespace(peer=A, device="cpu", steps=10, metrics={"seconds": 3.0, "samples_per_s": 100.0}),
           SimpleNamespace(peer=B, device="gpu", steps=90, metrics={"seconds": 1.0, "samples_per_s": 2880.0}),
           SimpleNamespace(peer=C, device="", steps=1, metrics={"seconds": "x", "samples_per_s": math.inf})]
    work = member_work(ups)  # type: ignore[arg-type]
    assert work[A] == {"device": "cpu", "steps": 10, "compute_s": 3.0, "samples_per_s": 100.0, "compute_share": 0.75}
    assert work[B]["compute_share"] == 0.25
    assert work[C]["compute_s"] == 0.0 and work[C]["samples_per_s"] == 0.0


def test_local_work_without_a_budget_leaves_it_to_the_job() -> None:
    from types import SimpleNamespace

    assert local_work(SimpleNamespace(budget_s=0.0, steps={}), A) == (0, 0.0)  # type: ignore[arg-type]
    assert local_work(SimpleNamespace(budget_s=8.0, steps={A: 12}), A) == (12, 8.0)  # type: ignore[arg-type]
