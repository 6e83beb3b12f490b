"""Which round was best, and the best round's model when a job's results hold it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpuflex import sdk

ROWS = [{"round": 1, "loss": 0.9, "accuracy": 0.70}, {"round": 2, "loss": 0.4, "accuracy": 0.94},
        {"round": 3, "loss": 0.5, "accuracy": 0.94}, {"round": 4, "loss": 0.6, "accuracy": 0.88}]


def test_best_round_by_each_metric() -> None:
    assert sdk.best_round(ROWS, "loss")["round"] == 2
    assert sdk.best_round(ROWS, "accuracy")["round"] == 2  # the earliest on a tie
    with pytest.raises(sdk.ModelUnavailable, match="no committed round has a perplexity"):
        sdk.best_round(ROWS, "perplexity")
    with pytest.raises(ValueError, match="metric must be one of"):
        sdk.best_round(ROWS, "f1")


class DoneJob(sdk.JobHandle):
    """A finished job whose results are written by ``write`` (no node: this tests the handle)."""

    def __init__(self, write) -> None:  # type: ignore[no-untyped-def]
        super().__init__("j", None)
        self._last = {"state": "done", "round": 4, "metrics": ROWS}
        self.write = write

    def results(self, out):  # type: ignore[no-untyped-def]
        self.write(Path(out))
        return sorted(Path(out).rglob("*"))


def test_the_best_rounds_model_comes_from_the_results_when_they_hold_it(tmp_path: Path) -> None:
    def with_best(out: Path) -> None:
        torch.save({"w": torch.tensor([4.0])}, out / "model.pt")
        (out / sdk.BEST_DIR).mkdir()
        torch.save({"w": torch.tensor([2.0])}, out / sdk.BEST_DIR / "model.pt")

    def last_only(out: Path) -> None:
        torch.save({"w": torch.tensor([4.0])}, out / "model.pt")

    assert DoneJob(with_best).state_dict("best")["w"].item() == 2.0
    assert DoneJob(with_best).state_dict()["w"].item() == 4.0
    with pytest.raises(sdk.ModelUnavailable, match=r"round 2 scored best .* only the model of its last round, 4"):
        DoneJob(last_only).state_dict("best")
