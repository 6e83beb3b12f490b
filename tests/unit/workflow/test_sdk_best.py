"""Which round was best, and each of a job's models (final, best, last) from its results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpuflex import sdk

ROWS = [{"round": 1, "loss": 0.9, "accuracy": 0.70}, {"round": 2, "loss": 0.4, "accuracy": 0.94},
        {"round": 3, "loss": 0.5, "accuracy": 0.94}, {"round": 4, "loss": 0.6, "accuracy": 0.88}]


def test_best_round_by_each_metric() -> None:
    assert sdk.best_round(ROWS, "loss")["round"] == 2
    assert sdk.best_round(ROWS, "accuracy")["round"] == 3  # the later on a tie, as the node picks
    assert sdk.best_round([{**r, "loss": float("nan")} for r in ROWS], "accuracy")["round"] == 3


def test_best_round_by_default_names_the_round_the_node_picks_for_its_best_model() -> None:
    from gpuflex.node.core.selection import score

    assert sdk.best_round(ROWS)["round"] == max(ROWS, key=lambda r: (score(r), r["round"]))["round"] == 3
    no_accuracy = [{"round": r["round"], "loss": r["loss"]} for r in ROWS]
    assert sdk.best_round(no_accuracy)["round"] == 2
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


def results(model_pt: str, other: str | None, same: bool = False):  # type: ignore[no-untyped-def]
    """What ``job results`` writes (gpuflex/node/export.py): model.pt is the job's final
    model, ``other`` (best/ or last/) the other one when it differs; 2.0 is round 2's, 4.0 round 4's."""
    def write(out: Path) -> None:
        top, rest = (2.0, 4.0) if model_pt == "best" else (4.0, 2.0)
        torch.save({"w": torch.tensor([top])}, out / "model.pt")
        if other:
            (out / other).mkdir()
            torch.save({"w": torch.tensor([rest])}, out / other / "model.pt")
        best_hash = "h4" if same else "h2"
        (out / "job.json").write_text(json.dumps({"model_hash": "h4", "model_pt": model_pt,
                                                  "best": {"round": 4 if same else 2, "model_hash": best_hash}}))
    return write


def test_each_model_comes_from_where_the_results_put_it() -> None:
    job = DoneJob(results("best", "last"))
    assert job.state_dict()["w"].item() == 2.0 and job.state_dict("best")["w"].item() == 2.0
    assert job.state_dict("last")["w"].item() == 4.0
    job = DoneJob(results("last", "best"))
    assert job.state_dict()["w"].item() == 4.0 and job.state_dict("best")["w"].item() == 2.0
    assert DoneJob(results("last", None, same=True)).state_dict("best")["w"].item() == 4.0  # one model
    with pytest.raises(sdk.ModelUnavailable, match=r"no last model .* the best is round 2"):
        DoneJob(results("best", None)).state_dict("last")  # a language model's: the final one alone
