"""codec = "sparse" through the node's pipeline: members' sparse updates summed without a
dense copy each, the root's step back sparse and replayed bit for bit, the residual kept
across a restart, and the job file refusing what cannot work."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation.encoded import EncodedDelta
from aggregation.sparse import SparseVector
from gpuflex.jobspec import JobSpec, JobSpecError
from gpuflex.node.core.modelblob import pack_model, unpack_model
from gpuflex.node.core.outerstep import outer_step, replay_step
from gpuflex.node.core.pipeline import (
    DeltaEncoder,
    decode_payload,
    make_reducer,
    pack_partial,
    unpack_partial,
)
from mesh.blob import blob_hash
from mesh.codec import WireError

SPARSE = JobSpec(model="digits-cnn", data="sklearn-digits", strategy="diloco", codec="sparse",
                 server_lr=1.0, server_momentum=0.0, sparse_chunk=256)


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 6000), members=st.integers(1, 4), rounds=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1), transform=st.sampled_from(["none", "dct"]),
       step_bits=st.sampled_from([4, 8, 32]), momentum=st.sampled_from([0.0, 0.9]))
def test_members_replaying_the_sparse_step_hold_the_roots_exact_model(
        size: int, members: int, rounds: int, seed: int, transform: str, step_bits: int, momentum: float) -> None:
    spec = dataclasses.replace(SPARSE, sparse_transform=transform, sparse_step_bits=step_bits,
                               server_momentum=momentum)
    rng = np.random.default_rng(seed)
    encoders = [DeltaEncoder(spec) for _ in range(members)]
    root_blob = member_blob = pack_model(rng.normal(size=size).astype(np.float32), {})
    for _ in range(rounds):
        reducer = make_reducer(spec, is_root=True)
        for i, enc in enumerate(encoders):
            vec = decode_payload(spec, enc.encode(rng.normal(scale=0.1, size=size).astype(np.float32)), size)
            assert isinstance(vec, SparseVector)  # folded as it is, not expanded per update
            reducer.add(vec, float(i + 1), f"m{i}")
        params, state, step = outer_step(spec, *unpack_model(root_blob), reducer.result())
        root_blob = pack_model(params, state)
        assert step is not None
        if size >= 4096 and transform == "none" and step_bits < 32:
            # the union of the members' 1/64 at most, a byte and a half per entry or less
            assert len(step) < members * size / 64 * 2.5 + 400
        member_blob = pack_model(*replay_step(spec, *unpack_model(member_blob), step))
        assert blob_hash(member_blob) == blob_hash(root_blob)


def test_a_partial_travels_as_its_nonzeros_and_sums_like_the_dense_one() -> None:
    rng = np.random.default_rng(1)
    size = 10_000
    group = make_reducer(SPARSE, is_root=False)
    for i in range(3):
        group.add(decode_payload(SPARSE, DeltaEncoder(SPARSE).encode(rng.normal(size=size).astype(np.float32)),
                                 size), 1.0, f"m{i}")
    avg = group.result()
    wire = pack_partial(SPARSE, avg)
    assert len(wire) < 0.1 * 4 * size  # not the dense float32 partial
    back = unpack_partial(SPARSE, wire, size)
    assert isinstance(back, SparseVector)
    np.testing.assert_array_equal(back.dense(), avg)
    with pytest.raises(WireError, match="size"):
        unpack_partial(SPARSE, wire, size + 1)


def test_a_sparse_update_for_another_chunk_or_transform_or_garbled_is_a_wire_error() -> None:
    vec = np.random.default_rng(2).normal(size=1000).astype(np.float32)
    other_chunk = DeltaEncoder(dataclasses.replace(SPARSE, sparse_chunk=512)).encode(vec)
    dct = DeltaEncoder(dataclasses.replace(SPARSE, sparse_transform="dct")).encode(vec)
    for wire in (other_chunk, dct):
        with pytest.raises(WireError, match="the job needs"):
            decode_payload(SPARSE, wire, vec.size)
    good = DeltaEncoder(SPARSE).encode(vec)
    with pytest.raises(WireError, match="could not be decoded"):
        decode_payload(SPARSE, good[:-3], vec.size)


def test_the_residual_survives_a_restart(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    first, second = (rng.normal(size=5000).astype(np.float32) for _ in range(2))
    path = tmp_path / "job" / "residual.f32"
    steady = DeltaEncoder(SPARSE, residual_path=path)
    steady.encode(first)
    assert path.is_file() and path.stat().st_mode & 0o777 == 0o600
    restarted = DeltaEncoder(SPARSE, residual_path=path)  # a new process reading the saved residual
    assert restarted.encode(second) == steady.encode(second)
    fresh = DeltaEncoder(SPARSE)  # what a member that lost its residual would send
    assert fresh.encode(second) != restarted.encode(second)


def test_a_step_claiming_a_huge_size_is_refused_before_anything_that_size_is_allocated() -> None:
    params = np.ones(100, np.float32)
    chunk = 32768
    claimed = 2**38  # 1 TB as float32: the counts for it fit in 17 MB, a dense copy never would
    counts = np.zeros(-(-claimed // chunk), "<u2")
    step = EncodedDelta("sparse", claimed, b"", {"cfg": np.array([chunk, 8, 0], "<i8"), "count": counts,
                                                 "offset": np.zeros(0, np.uint8),
                                                 "scale": np.zeros(counts.size, "<f4")}).to_bytes()
    with pytest.raises(WireError, match="values, the model 100"):
        replay_step(SPARSE, params, {}, step)


def test_an_update_in_another_codec_or_claiming_another_size_is_refused_before_decoding() -> None:
    int8 = dataclasses.replace(SPARSE, codec="int8")
    huge = dataclasses.replace(SPARSE, codec="topk")
    claimed = EncodedDelta("topk", 2**38, b"", {"index": np.zeros(0, "<i8")}).to_bytes()  # 1 TB dense
    with pytest.raises(WireError, match="the job needs 'topk' of 100"):
        decode_payload(huge, claimed, 100)
    sparse = DeltaEncoder(SPARSE).encode(np.ones(100, np.float32))
    with pytest.raises(WireError, match="the job needs 'int8' of 100"):
        decode_payload(int8, sparse, 100)


def test_a_damaged_residual_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "residual.f32"
    path.write_bytes(b"abc")
    enc = DeltaEncoder(SPARSE, residual_path=path)
    assert enc.feedback is not None and enc.feedback.residual is None


@pytest.mark.parametrize("fields, field, reason", [
    ({"secure_aggregation": True}, "codec", "masking hides which coordinates"),
    ({"drift_correction": "scaffold", "normalization": "none"}, "codec", "control variates"),
    ({"rule": "median"}, "rule", "step vanishes"),
    ({"rule": "trimmed-mean", "rule_params": {"beta": 0.1}}, "rule", "step vanishes"),
    ({"sparse_transform": "dct", "sparse_chunk": 4096}, "sparse_chunk", "at most 1024"),
    ({"sparse_bits": 5}, "sparse_bits", "one of 2, 3, 4, 8"),
    ({"sparse_density": 0.9}, "sparse_density", "0.5"),
    ({"sparse_density": 1e-6}, "sparse_density", "≥"),
    ({"sparse_chunk": 1 << 20}, "sparse_chunk", "32768"),
    ({"sparse_step_bits": 2}, "sparse_step_bits", "one of 4, 8, 32"),
    ({"sparse_feedback_decay": 0.0}, "sparse_feedback_decay", "> 0"),
    ({"codec": "int8", "sparse_bits": 4}, "sparse_bits", "only used with codec = 'sparse'"),
])
def test_the_job_file_refuses_what_cannot_work_with_the_reason(fields: dict[str, object], field: str,
                                                               reason: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "codec": "sparse", **fields})
    assert any(name == field and reason in message for name, message in caught.value.errors), caught.value.errors


def test_robust_rules_that_work_on_sparse_updates_are_accepted_and_round_trip() -> None:
    for fields in ({"rule": "krum", "rule_params": {"f": 1}},
                   {"rule": "centered-clipping", "rule_params": {"tau": 1.0}}, {"norm_bound": 3.0}):
        spec = JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "codec": "sparse", **fields})
        assert JobSpec.from_dict(spec.to_dict()) == spec
    plain = JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits"})
    assert JobSpec.from_dict(plain.to_dict()) == plain  # a spec from the wire names every field
