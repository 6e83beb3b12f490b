"""DiLoCo's communication saving rests on int8 costing about a quarter of fp32 on the wire,
both ways, while training as well; checked here on a tiny run through the node's own
encoder, decoder and outer optimizer (gpuflex/simulate.py)."""

from __future__ import annotations

import dataclasses

from gpuflex.jobspec import JobSpec
from gpuflex.simulate import simulate

DILOCO = JobSpec(model="digits-cnn", data="sklearn-digits", partition="iid", strategy="diloco",
                 optimizer="adamw", lr=3e-3, weight_decay=0.1, local_epochs=0, local_steps=10,
                 server_lr=0.7, server_momentum=0.9, rounds=3)


def test_diloco_int8_matches_fp32_loss_with_a_quarter_of_the_upload_and_an_eighth_of_the_download():
    fp32 = simulate(DILOCO, num_parts=2)
    int8 = simulate(dataclasses.replace(DILOCO, codec="int8"), num_parts=2, error_feedback=True)
    assert len(fp32) == len(int8) == 3
    assert fp32[-1]["loss"] < 0.8 * fp32[0]["loss"]  # it trains at all
    assert abs(int8[-1]["loss"] - fp32[-1]["loss"]) <= 0.05 * fp32[-1]["loss"] + 0.02
    up32 = sum(h["upload_bytes"] for h in fp32)
    up8 = sum(h["upload_bytes"] for h in int8)
    assert up8 <= 0.3 * up32
    # fp32 members download the model and its outer momentum; int8 members the int8 step.
    down32 = sum(h["download_bytes"] for h in fp32)
    down8 = sum(h["download_bytes"] for h in int8)
    assert down8 <= 0.15 * down32
