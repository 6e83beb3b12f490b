"""The committed step in the job's codec: members rebuild the root's model bit for bit from
the previous model and the step, so they download about a quarter of the model's bytes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.jobspec import JobSpec, JobSpecError
from gpuflex.node.core.modelblob import pack_model, unpack_model
from gpuflex.node.core.outerstep import outer_step, replay_step
from gpuflex.node.core.pipeline import DeltaEncoder, decode_payload
from mesh.blob import blob_hash
from mesh.codec import WireError

DILOCO = JobSpec(model="digits-cnn", data="sklearn-digits", strategy="diloco", codec="int8",
                 server_lr=0.7, server_momentum=0.9)


@settings(max_examples=30, deadline=None)
@given(size=st.integers(1, 5000), rounds=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       strategy=st.sampled_from(["fedavg", "fedavgm", "fedadam", "diloco"]),
       codec=st.sampled_from(["fp16", "int8"]))
def test_a_member_replaying_the_steps_holds_the_roots_exact_model(
        size: int, rounds: int, seed: int, strategy: str, codec: str) -> None:
    spec = dataclasses.replace(DILOCO, strategy=strategy, codec=codec)
    rng = np.random.default_rng(seed)
    root_blob = member_blob = pack_model(rng.normal(size=size).astype(np.float32), {})
    for _ in range(rounds):
        avg = rng.normal(scale=0.1, size=size).astype(np.float32)
        params, state, step = outer_step(spec, *unpack_model(root_blob), avg)
        root_blob = pack_model(params, state)
        assert step is not None
        if size >= 1000:  # past the fixed headers: half the model (fp16) or less
            assert len(step) < 0.6 * len(root_blob)
        member_blob = pack_model(*replay_step(spec, *unpack_model(member_blob), step))
        assert blob_hash(member_blob) == blob_hash(root_blob)


def test_top_k_and_no_codec_commit_the_model_itself() -> None:
    params = np.ones(100, np.float32)
    for codec in ("none", "topk"):
        spec = dataclasses.replace(DILOCO, codec=codec)
        new, _, step = outer_step(spec, params, {}, np.full(100, 0.5, np.float32))
        assert step is None and new.shape == params.shape


def test_a_garbled_or_mis_sized_step_is_a_wire_error() -> None:
    params = np.ones(10, np.float32)
    _, _, step = outer_step(DILOCO, params, {}, np.ones(10, np.float32))
    assert step is not None
    with pytest.raises(WireError, match="could not be decoded"):
        replay_step(DILOCO, params, {}, b"junk" + step[4:])
    with pytest.raises(WireError, match="values, the model"):
        replay_step(DILOCO, np.ones(11, np.float32), {}, step)


def test_error_feedback_sends_what_top_k_dropped_in_a_later_round() -> None:
    spec = dataclasses.replace(DILOCO, codec="topk")
    delta = np.linspace(1.0, 2.0, 1000, dtype=np.float32)
    with_ef, without = DeltaEncoder(spec), DeltaEncoder(dataclasses.replace(spec, error_feedback=False))
    sent_ef = sum(decode_payload(spec, with_ef.encode(delta), delta.size) for _ in range(200))
    sent_plain = sum(decode_payload(spec, without.encode(delta), delta.size) for _ in range(200))
    # Without feedback the small coordinates never travel; with it every one does, and what
    # was sent plus what is still held back is exactly what was trained.
    assert np.count_nonzero(sent_plain) < 0.5 * delta.size
    assert np.count_nonzero(sent_ef) == delta.size
    assert with_ef.feedback is not None and with_ef.feedback.residual is not None
    assert np.allclose(sent_ef + with_ef.feedback.residual, 200 * delta, rtol=1e-4)


def test_an_unknown_codec_is_refused_when_the_job_is_read() -> None:
    with pytest.raises(JobSpecError, match="codec"):
        JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "codec": "zstd"})
