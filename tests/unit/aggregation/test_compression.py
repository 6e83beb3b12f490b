"""Codecs: error bounds, exact top-k, error feedback and the byte format."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aggregation import AggregationError, EncodedDelta, ErrorFeedback, decode_delta, make_codec
from aggregation.compression import Int8Codec, TopKCodec

_finite32 = st.floats(-1e4, 1e4, allow_nan=False, width=32)
_vectors = hnp.arrays(np.float32, st.integers(1, 3000), elements=_finite32)


def _roundtrip(name: str, vec: np.ndarray, **params: float) -> np.ndarray:
    enc = make_codec(name, **params).encode(vec)
    out = decode_delta(enc.to_bytes())
    assert out.dtype == np.float32 and out.shape == (vec.size,)
    return out


@settings(max_examples=60, deadline=None)
@given(vec=_vectors)
def test_none_is_exact(vec: np.ndarray) -> None:
    np.testing.assert_array_equal(_roundtrip("none", vec), vec)


@settings(max_examples=60, deadline=None)
@given(vec=_vectors)
def test_fp16_error_bound(vec: np.ndarray) -> None:
    err = np.abs(_roundtrip("fp16", vec) - vec)
    assert err.max() <= 1e-3 * float(np.abs(vec).max()) + 1e-7


@settings(max_examples=60, deadline=None)
@given(vec=_vectors, block=st.integers(1, 700))
def test_int8_error_is_half_a_step(vec: np.ndarray, block: int) -> None:
    out = _roundtrip("int8", vec, block=block)
    pad = -vec.size % block
    grid = np.abs(np.concatenate([vec, np.zeros(pad, np.float32)])).reshape(-1, block)
    half_step = np.repeat(grid.max(axis=1) / 254, block)[: vec.size]
    assert (np.abs(out - vec) <= half_step * (1 + 1e-5) + 1.5e-36).all()


@settings(max_examples=60, deadline=None)
@given(vec=_vectors, fraction=st.floats(0.001, 1.0))
def test_topk_keeps_exactly_the_k_largest(vec: np.ndarray, fraction: float) -> None:
    enc = TopKCodec(fraction).encode(vec)
    k = min(vec.size, max(1, int(np.ceil(fraction * vec.size))))
    index = enc.meta["index"]
    assert index.size == k and len(np.unique(index)) == k
    out = decode_delta(enc)
    np.testing.assert_array_equal(out[index], vec[index])
    dropped = np.setdiff1d(np.arange(vec.size), index)
    if dropped.size:
        assert np.abs(vec[index]).min() >= np.abs(vec[dropped]).max()
        assert not out[dropped].any()


def test_topk_sampled_threshold_path_is_exact() -> None:
    rng = np.random.default_rng(3)
    vec = rng.standard_normal(500_000).astype(np.float32)
    enc = TopKCodec(0.01).encode(vec)
    expected = np.sort(np.argsort(np.abs(vec), kind="stable")[-5000:])
    np.testing.assert_array_equal(np.sort(enc.meta["index"]), expected)


@settings(max_examples=30, deadline=None)
@given(
    rounds=st.integers(1, 6),
    size=st.integers(1, 400),
    seed=st.integers(0, 2**32 - 1),
    name=st.sampled_from(["topk", "int8", "fp16"]),
)
def test_error_feedback_conserves_the_sum(rounds: int, size: int, seed: int, name: str) -> None:
    rng = np.random.default_rng(seed)
    feedback = ErrorFeedback(make_codec(name))
    sent = np.zeros(size, np.float64)
    total = np.zeros(size, np.float64)
    for _ in range(rounds):
        vec = rng.standard_normal(size).astype(np.float32)
        total += vec
        sent += decode_delta(feedback.compress(vec))
    assert feedback.residual is not None
    np.testing.assert_allclose(sent + feedback.residual, total, atol=1e-5)


def test_error_feedback_reset_and_size_check() -> None:
    feedback = ErrorFeedback(TopKCodec(0.5))
    feedback.compress(np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_allclose(feedback.residual, [1.0, 2.0, 0.0, 0.0])  # type: ignore[arg-type]
    with pytest.raises(AggregationError, match="residual"):
        feedback.compress(np.ones(3))
    feedback.reset()
    assert feedback.residual is None


def test_compression_ratios() -> None:
    vec = np.ones(8192, np.float32)
    assert len(make_codec("fp16").encode(vec).payload) == 2 * 8192
    enc = make_codec("int8").encode(vec)
    assert enc.nbytes == 8192 + 2 * 4 + 8


def test_int8_decodes_with_the_senders_block() -> None:
    vec = np.linspace(-1, 1, 1000, dtype=np.float32)
    enc = Int8Codec(block=100).encode(vec)
    np.testing.assert_allclose(Int8Codec().decode(enc), vec, atol=1 / 254 + 1e-6)


@pytest.mark.parametrize("name", ["none", "fp16", "int8", "topk"])
def test_non_finite_input_raises(name: str) -> None:
    with pytest.raises(AggregationError, match="NaN or inf"):
        make_codec(name).encode(np.array([1.0, np.inf]))


def test_fp16_out_of_range_raises() -> None:
    with pytest.raises(AggregationError, match="fp16 range"):
        make_codec("fp16").encode(np.array([1e5], np.float32))
    # The check runs block by block with the cast: a bad value deep in a long vector counts.
    far = np.zeros(1_000_003, np.float32)
    far[-1] = -7e4
    with pytest.raises(AggregationError, match="fp16 range"):
        make_codec("fp16").encode(far)
    far[-1] = np.nan
    with pytest.raises(AggregationError, match="NaN or inf"):
        make_codec("fp16").encode(far)


@settings(max_examples=50, deadline=None)
@given(vec=hnp.arrays(np.float32, st.integers(1, 70_000), elements=st.floats(-65504, 65504, width=32)))
def test_fp16_payload_is_numpys_own_cast(vec: np.ndarray) -> None:
    assert bytes(make_codec("fp16").encode(vec).payload) == vec.astype("<f2").tobytes()


def test_codec_factory_errors() -> None:
    with pytest.raises(AggregationError, match="none, fp16, int8, topk"):
        make_codec("zstd")
    with pytest.raises(AggregationError, match="bad parameters"):
        make_codec("int8", blocks=2)
    with pytest.raises(AggregationError, match="fraction"):
        make_codec("topk", fraction=0)
    with pytest.raises(AggregationError, match="block"):
        make_codec("int8", block=0)


def test_decode_rejects_a_mismatched_delta() -> None:
    enc = make_codec("fp16").encode(np.ones(4))
    with pytest.raises(AggregationError, match="not 'int8'"):
        make_codec("int8").decode(enc)
    short = EncodedDelta("fp16", 5, enc.payload)
    with pytest.raises(AggregationError, match="expected 10"):
        decode_delta(short)
    bad_index = EncodedDelta("topk", 2, b"\0" * 4, {"index": np.array([7], "<u4")})
    with pytest.raises(AggregationError, match="out of range"):
        decode_delta(bad_index)


def test_bytes_roundtrip_keeps_meta() -> None:
    enc = Int8Codec(block=3).encode(np.arange(10, dtype=np.float32))
    back = EncodedDelta.from_bytes(enc.to_bytes())
    assert (back.codec, back.size, back.payload) == (enc.codec, enc.size, enc.payload)
    for key, value in enc.meta.items():
        np.testing.assert_array_equal(back.meta[key], value)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_truncated_or_garbled_bytes_raise(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(["none", "fp16", "int8", "topk"]))
    wire = make_codec(name).encode(np.linspace(-1, 1, 50, dtype=np.float32)).to_bytes()
    cut = data.draw(st.integers(0, len(wire) - 1))
    with pytest.raises(AggregationError):
        decode_delta(wire[:cut])
    garbled = bytearray(wire)
    pos = data.draw(st.integers(0, len(wire) - 1))
    garbled[pos] ^= data.draw(st.integers(1, 255))
    try:
        out = decode_delta(bytes(garbled))
    except AggregationError:
        return
    assert out.dtype == np.float32  # a flipped data byte may still decode


def test_trailing_bytes_and_bad_magic() -> None:
    wire = make_codec("none").encode(np.ones(2)).to_bytes()
    with pytest.raises(AggregationError, match="trailing"):
        EncodedDelta.from_bytes(wire + b"x")
    with pytest.raises(AggregationError, match="magic"):
        EncodedDelta.from_bytes(b"PK" + wire[2:])


def test_int8_flushes_subnormal_blocks() -> None:
    vec = np.array([1e-40, -3e-41, 0.0], np.float32)
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        out = _roundtrip("int8", vec)
    assert not out.any()
