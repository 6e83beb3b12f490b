"""The step planner of time-budgeted rounds, and how FedNova reads the members' claims."""

from __future__ import annotations

import math

import pytest

from gpuflex.node.core.workfields import MAX_PLANNED_STEPS
from gpuflex.node.core.workplan import (
    SLOW_SHARE,
    STEP_HEADROOM,
    blend,
    local_work,
    member_work,
    plan_steps,
    recorded_rates,
    slow_members,
    valid_rate,
)

A, B, C = "peer-a", "peer-b", "peer-c"


def test_steps_allow_headroom_over_what_each_members_throughput_fits() -> None:
    # 10 s budget, batches of 32: 320 samples/s fits 100 steps, and the plan allows 1.5x that;
    # 32 samples/s fits 10, allowed 15. The member's time stop ends training at the budget.
    steps = plan_steps([A, B], {A: 320.0, B: 32.0}, budget_s=10.0, batch_size=32)
    assert STEP_HEADROOM == 1.5
    assert steps == {A: 150, B: 15}
    assert steps[A] / steps[B] == 320.0 / 32.0  # in proportion to the throughputs


def test_rounding_is_down_and_exact_multiples_are_kept() -> None:
    # 38 samples/s * 1.5 * 20 s / 19 per batch = 60 steps exactly (float error must not drop one)
    assert plan_steps([A], {A: 38.0}, budget_s=20.0, batch_size=19) == {A: 60}
    assert plan_steps([A], {A: 57.0}, budget_s=20.0, batch_size=19) == {A: 90}  # 90.0 exactly
    assert plan_steps([A], {A: 37.9}, budget_s=20.0, batch_size=19) == {A: 59}  # 59.84 -> 59


def test_a_member_too_slow_for_one_step_still_gets_one() -> None:
    # 1000 * 1.5 * 5 / 64 = 117.2 -> 117; 0.5 samples/s fits no step of 64 in 5 s: still one.
    assert plan_steps([A, B], {A: 1000.0, B: 0.5}, budget_s=5.0, batch_size=64) == {A: 117, B: 1}


def test_zero_or_unknown_throughput_gets_the_largest_count_and_its_time_stop_cuts_it() -> None:
    steps = plan_steps([A, B, C], {A: 64.0, B: 0.0}, budget_s=10.0, batch_size=32)
    assert steps == {A: 30, B: 30, C: 30}
    # Nobody measured yet: the cap (the job's local_steps) or the wire limit.
    assert plan_steps([A, B], {}, budget_s=10.0, batch_size=32, cap=50) == {A: 50, B: 50}
    assert plan_steps([A], {A: float("nan")}, budget_s=10.0, batch_size=32) == {A: MAX_PLANNED_STEPS}


def test_the_jobs_local_steps_caps_every_count() -> None:
    assert plan_steps([A, B], {A: 1e6, B: 10.0}, budget_s=10.0, batch_size=10, cap=25) == {A: 25, B: 15}


def test_a_member_that_overshoots_is_planned_fewer_steps_next_round() -> None:
    # Allowed 150 steps at 320 samples/s; it really ran at half that (load from elsewhere).
    rate = 320.0
    first = plan_steps([A], {A: rate}, 10.0, 32)[A]
    measured = 160.0
    rate = blend(rate, measured)
    second = plan_steps([A], {A: rate}, 10.0, 32)[A]
    assert second < first
    rate = blend(rate, measured)
    third = plan_steps([A], {A: rate}, 10.0, 32)[A]
    # converging on what the budget allows at the real rate: 160 * 10 * 1.5 / 32 = 75
    assert third < second and 75 <= third <= 75 * 1.3


def test_slow_members_are_those_under_a_quarter_of_the_fastest() -> None:
    assert SLOW_SHARE == 0.25
    rates = {A: 1000.0, B: 250.0, C: 249.0}
    assert slow_members(rates) == {C}  # exactly a quarter is not slow
    # Unknown or implausible throughputs are not judged; one member alone is never slow.
    assert slow_members({A: 1000.0, B: None, C: "fast"}) == set()
    assert slow_members({A: 5.0}) == set()
    assert slow_members({}) == set()


def test_recorded_rates_read_a_results_contributors() -> None:
    contributors = [{"peer": A, "samples_per_s": 900.0}, {"peer": B, "samples_per_s": 40.0},
                    {"peer": 7, "samples_per_s": 1.0}, {"peer": C}]
    assert recorded_rates(contributors) == {A: 900.0, B: 40.0, C: None}
    assert slow_members(recorded_rates(contributors)) == {B}


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

    ups = [SimpleNamespace(peer=A, device="cpu", steps=10, metrics={"seconds": 3.0, "samples_per_s": 100.0,
                                                                    "update_bytes": 5120.0}),
           SimpleNamespace(peer=B, device="gpu", steps=90, metrics={"seconds": 1.0, "samples_per_s": 2880.0}),
           SimpleNamespace(peer=C, device="", steps=1, metrics={"seconds": "x", "samples_per_s": math.inf,
                                                                 "update_bytes": -3.0})]
    work = member_work(ups)  # type: ignore[arg-type]
    assert work[A] == {"device": "cpu", "steps": 10, "compute_s": 3.0, "samples_per_s": 100.0, "compute_share": 0.75,
                       "update_bytes": 5120}
    assert work[B]["compute_share"] == 0.25 and work[B]["update_bytes"] == 0  # an update that does not say
    assert work[C]["compute_s"] == 0.0 and work[C]["samples_per_s"] == 0.0 and work[C]["update_bytes"] == 0


def test_local_work_without_a_budget_leaves_it_to_the_job() -> None:
    from types import SimpleNamespace

    assert local_work(SimpleNamespace(budget_s=0.0, steps={}), A) == (0, 0.0)  # type: ignore[arg-type]
    assert local_work(SimpleNamespace(budget_s=8.0, steps={A: 12}), A) == (12, 8.0)  # type: ignore[arg-type]
