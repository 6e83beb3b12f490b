"""The model a job hands out: the best-scored committed round's, or the last one's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuflex.node.core.selection import best_result, score, selected_result


def _res(round_: int, **metrics: Any) -> Any:
    return SimpleNamespace(round=round_, metrics=metrics, model_hash=f"m{round_}")


def test_accuracy_wins_then_minus_loss_and_junk_scores_nothing() -> None:
    assert score({"accuracy": 0.9, "loss": 5.0}) == 0.9
    assert score({"loss": 2.0}) == -2.0
    assert score({"accuracy": float("nan"), "loss": float("inf")}) is None
    assert score({"accuracy": True}) is None and score({}) is None


def test_the_best_round_is_chosen_and_the_later_one_on_a_tie() -> None:
    results = [_res(1, accuracy=0.5), _res(2, accuracy=0.94), _res(3, accuracy=0.94), _res(4, accuracy=0.88)]
    assert best_result(results).round == 3
    assert selected_result("best", results).round == 3
    assert selected_result("last", results).round == 4


def test_without_scores_the_last_model_is_handed_out() -> None:
    results = [_res(1), _res(2)]
    assert best_result(results) is None
    assert selected_result("best", results).round == 2
    assert selected_result("best", []) is None


@given(st.lists(st.floats(0, 1), min_size=1, max_size=30))
def test_no_committed_round_scores_higher_than_the_chosen_one(accuracies: list[float]) -> None:
    results = [_res(i + 1, accuracy=a) for i, a in enumerate(accuracies)]
    chosen = best_result(results)
    assert chosen is not None
    assert all(r.metrics["accuracy"] <= chosen.metrics["accuracy"] for r in results)
    assert max(r.round for r in results if r.metrics["accuracy"] == chosen.metrics["accuracy"]) == chosen.round
