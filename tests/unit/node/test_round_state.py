"""``RoundState`` records the round's transitions and keeps its postcondition: every plan it
keeps for later (held for an attempt not reached yet, or behind, for one passed) is for a
live attempt of its round. Each row is a sequence of transitions and what the state holds
after it; the postcondition is checked after every step, and its fields cannot be written
from outside."""

from __future__ import annotations

from typing import Any

import pytest

from gpuflex.node.core.messages import Plan, make_plan, parse_plan
from gpuflex.node.state import MAX_HELD_PLANS, RoundDeadlines, RoundState
from mesh.codec import open_envelope
from mesh.identity import Identity

COORD = Identity(b"\x07" * 32)
DEADLINES = RoundDeadlines(train=10.0, slack=1.0, members=1)


def plan(attempt: int, round_: int = 3) -> Plan:
    return parse_plan(open_envelope(make_plan(
        COORD, job="j", round=round_, attempt=attempt, coordinator=COORD.peer_id, base_hash="b" * 64,
        prev_result="p" * 64, members=[COORD.peer_id], parent={COORD.peer_id: None}, train_deadline=1e9,
        reduce_slack_s=1.0)))


def step(rs: RoundState, op: str, arg: int | None) -> Any:
    """One transition; ``arg`` is an attempt (or, for ``other_round``, a plan of round 9's)."""
    if op == "begin":
        return rs.begin_attempt(arg or 0)
    if op == "in_force":
        return rs.put_in_force(plan(arg or 0), DEADLINES)
    if op == "take_up":
        return rs.take_up(plan(arg or 0), DEADLINES)
    if op == "hold":
        return rs.hold(plan(arg or 0))
    if op == "hold_other_round":
        return rs.hold(plan(arg or 0, round_=9))
    if op == "keep_behind":
        return rs.keep_behind(plan(arg or 0))
    if op == "take_held":
        got = rs.take_held()
        return None if got is None else got.attempt
    if op == "take_behind":
        got = rs.take_behind()
        return None if got is None else got.attempt
    if op == "abort":
        return rs.abort(arg or 0)
    raise AssertionError(op)


# (name, [(op, attempt, what the transition returns)], expected: attempt, plan's attempt,
#  held attempts, behind's attempt, aborted attempts)
ROWS: list[tuple[str, list[tuple[str, int | None, Any]], tuple[int, int | None, set[int], int | None, set[int]]]] = [
    ("an abort drops the plan held for its attempt",
     [("hold", 2, True), ("abort", 2, None)], (0, None, set(), None, {2})),
    ("an abort drops the plan kept behind for its attempt",
     [("begin", 3, None), ("keep_behind", 1, True), ("abort", 1, None)], (3, None, set(), None, {1})),
    ("an abort of another attempt keeps both",
     [("hold", 2, True), ("keep_behind", 0, True), ("abort", 1, None)], (0, None, {2}, 0, {1})),
    ("an aborted attempt's plan is not held",
     [("abort", 2, None), ("hold", 2, False)], (0, None, set(), None, {2})),
    ("an aborted attempt's plan is not kept behind",
     [("begin", 4, None), ("abort", 2, None), ("keep_behind", 2, False)], (4, None, set(), None, {2})),
    ("another round's plan is not held",
     [("hold_other_round", 2, False)], (0, None, set(), None, set())),
    ("one plan is held per attempt",
     [("hold", 2, True), ("hold", 2, False)], (0, None, {2}, None, set())),
    ("only the latest passed plan is kept behind",
     [("begin", 5, None), ("keep_behind", 3, True), ("keep_behind", 1, False), ("keep_behind", 4, True)],
     (5, None, set(), 4, set())),
    ("the lowest held plans are kept, at most MAX_HELD_PLANS",
     [*(("hold", a, True) for a in range(MAX_HELD_PLANS, 0, -1)), ("hold", MAX_HELD_PLANS + 1, False)],
     (0, None, set(range(1, MAX_HELD_PLANS + 1)), None, set())),
    ("taking the held plan drops those of earlier attempts",
     [("hold", 1, True), ("hold", 3, True), ("hold", 5, True), ("begin", 3, None), ("take_held", None, 3)],
     (3, None, {5}, None, set())),
    ("taking the kept-behind plan leaves none",
     [("begin", 2, None), ("keep_behind", 1, True), ("take_behind", None, 1), ("take_behind", None, None)],
     (2, None, set(), None, set())),
    ("a plan in force does not change the attempt",
     [("begin", 1, None), ("in_force", 3, None)], (1, 3, set(), None, set())),
    ("taking up a plan goes back to its attempt",
     [("begin", 4, None), ("take_up", 2, None)], (2, 2, set(), None, set())),
    ("an abort of the plan in force keeps it, recorded as aborted",
     [("in_force", 0, None), ("abort", 0, None)], (0, 0, set(), None, {0})),
]


@pytest.mark.parametrize(("steps", "expected"), [(s, e) for _, s, e in ROWS], ids=[n for n, _, _ in ROWS])
def test_each_transition_keeps_only_live_plans(
        steps: list[tuple[str, int | None, Any]],
        expected: tuple[int, int | None, set[int], int | None, set[int]]) -> None:
    rs = RoundState(round=3)
    for op, arg, returns in steps:
        assert step(rs, op, arg) == returns, f"{op}({arg})"
        assert rs.kept_plans_live(), f"after {op}({arg})"
        kept = [*rs.held.values(), *([rs.behind] if rs.behind is not None else [])]
        assert not [p.attempt for p in kept if p.attempt in rs.aborted or p.round != rs.round]
    attempt, in_force, held, behind, aborted = expected
    assert rs.attempt == attempt
    assert (rs.plan.attempt if rs.plan is not None else None) == in_force
    assert set(rs.held) == held
    assert (rs.behind.attempt if rs.behind is not None else None) == behind
    assert rs.aborted == aborted


def test_a_plan_of_another_round_is_never_put_in_force() -> None:
    rs = RoundState(round=3)
    with pytest.raises(ValueError):
        rs.put_in_force(plan(0, round_=4), DEADLINES)
    assert rs.plan is None


@pytest.mark.parametrize("name", ["round", "attempt", "plan", "deadlines", "behind", "aborted", "held", "collectors"])
def test_its_fields_are_written_only_through_its_transitions(name: str) -> None:
    rs = RoundState(round=3)
    with pytest.raises(AttributeError):
        setattr(rs, name, None)
    mutable: Any = getattr(rs, name)
    if name in ("held", "collectors"):
        with pytest.raises(TypeError):
            mutable[1] = plan(1)
    if name == "aborted":
        assert not hasattr(mutable, "add")
