"""``benchmarks.noniid``'s central runs scored at several step counts, and its ``--set`` parser.

One sequential central run scored at ``k`` steps on the way must score exactly what a run of
``k`` steps scores: scoring in between may not move the data shuffles that follow."""

from __future__ import annotations

import dataclasses

import torch

from benchmarks.noniid import central_at_steps, parse_settings
from gpuflex.jobspec import JobSpec
from gpuflex.ml.baseline import central_baseline
from gpuflex.nodeconfig import NodeConfig


def test_a_checkpoint_scores_what_a_run_of_that_many_steps_scores() -> None:
    # 60 steps of 32 cross an epoch of sklearn digits' 1,347 training images (42 batches), so
    # the second epoch's shuffle is drawn after the checkpoint at 30 steps was scored.
    spec = JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "rounds": 1,
                              "local_epochs": 0, "local_steps": 60, "batch_size": 32, "seed": 0})
    torch.manual_seed(0)
    scores = central_at_steps(spec, [30, 60], NodeConfig())
    assert sorted(scores) == [30, 60] and all(0.0 <= a <= 1.0 for a in scores.values())
    for steps in (30, 60):
        torch.manual_seed(0)
        alone = central_baseline(dataclasses.replace(spec, local_steps=steps))
        assert alone["steps"] == steps and alone["accuracy"] == scores[steps]


def test_settings_are_read_as_json_where_they_parse() -> None:
    assert parse_settings(["rounds=20", "lr=0.005", "drift_correction=fedprox", "x=true"]) == {
        "rounds": 20, "lr": 0.005, "drift_correction": "fedprox", "x": True}
