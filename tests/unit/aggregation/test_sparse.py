"""The sparse codec: top-k per chunk, its stated error, error feedback, sparse sums, and
hostile input (indices out of range, duplicates, lengths that lie)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aggregation import (
    AggregationError,
    EncodedDelta,
    ErrorFeedback,
    WeightedAccumulator,
    decode_delta,
)
from aggregation.sparse import (
    SPARSE_BITS,
    SparseCodec,
    _pack,
    decode_sparse,
    encode_nonzero,
    to_sparse,
)

_finite32 = st.floats(-1e3, 1e3, allow_nan=False, width=32)
_vectors = hnp.arrays(np.float32, st.integers(1, 2000), elements=_finite32)
_chunks = st.sampled_from([16, 64, 100, 256, 1024])
_densities = st.sampled_from([1 / 64, 1 / 16, 0.1, 0.5, 1.0])


@settings(max_examples=80, deadline=None)
@given(vec=_vectors, chunk=_chunks, density=_densities, bits=st.sampled_from(SPARSE_BITS))
def test_round_trip_keeps_top_k_per_chunk_within_the_stated_error(vec: np.ndarray, chunk: int, density: float,
                                                                  bits: int) -> None:
    codec = SparseCodec(density=density, bits=bits, chunk=chunk)
    out = decode_delta(codec.encode(vec).to_bytes())
    assert out.dtype == np.float32 and out.shape == vec.shape
    vec_idx, _, _ = decode_sparse(EncodedDelta.from_bytes(codec.encode(vec).to_bytes()))
    kept = np.zeros(vec.size, dtype=bool)
    kept[vec_idx.index] = True
    assert not out[~kept].any()  # nothing outside the kept set
    for start in range(0, vec.size, chunk):
        sl = slice(start, min(start + chunk, vec.size))
        part, keep = np.abs(vec[sl]), kept[sl]
        assert keep.sum() == codec.kept(part.size)
        if (~keep).any():  # every kept magnitude is at least every dropped one
            assert part[keep].min() >= part[~keep].max()
        absmax = float(part[keep].max())
        bound = 0.0 if bits == 32 else absmax / (2**bits - 1)
        err = np.abs(out[sl][keep] - vec[sl][keep])
        assert err.max() <= bound * (1 + 1e-5) + 1e-30


@settings(max_examples=40, deadline=None)
@given(vec=_vectors, chunk=st.sampled_from([16, 64, 128]))
def test_dct_keeping_everything_is_the_identity(vec: np.ndarray, chunk: int) -> None:
    out = SparseCodec(density=1.0, bits=32, chunk=chunk, transform="dct").decode(
        SparseCodec(density=1.0, bits=32, chunk=chunk, transform="dct").encode(vec))
    np.testing.assert_allclose(out, vec, atol=1e-4 * (1 + float(np.abs(vec).max())))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), size=st.integers(1, 3000), rounds=st.integers(1, 12),
       bits=st.sampled_from((2, 4)), transform=st.sampled_from(("none", "dct")))
def test_error_feedback_sent_plus_residual_is_the_sum_of_true_updates(seed: int, size: int, rounds: int,
                                                                      bits: int, transform: str) -> None:
    rng = np.random.default_rng(seed)
    ef = ErrorFeedback(SparseCodec(density=1 / 32, bits=bits, chunk=64, transform=transform))
    sent = np.zeros(size, np.float64)
    true = np.zeros(size, np.float64)
    for _ in range(rounds):
        delta = rng.standard_normal(size).astype(np.float32)
        true += delta
        sent += decode_delta(ef.compress(delta).to_bytes())
    assert ef.residual is not None
    np.testing.assert_allclose(sent + ef.residual, true, atol=1e-4 * rounds * (1 + float(np.abs(true).max())))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), size=st.integers(1, 5000), members=st.integers(1, 6),
       chunk=_chunks, density=_densities, bits=st.sampled_from(SPARSE_BITS))
def test_chunked_sparse_sum_equals_the_dense_sum(seed: int, size: int, members: int, chunk: int,
                                                 density: float, bits: int) -> None:
    rng = np.random.default_rng(seed)
    codec = SparseCodec(density=density, bits=bits, chunk=chunk)
    wires = [codec.encode(rng.standard_normal(size).astype(np.float32)).to_bytes() for _ in range(members)]
    weights = rng.integers(1, 100, members).astype(float)
    sparse, dense = WeightedAccumulator(), WeightedAccumulator()
    for wire, w in zip(wires, weights, strict=True):
        vec = to_sparse(EncodedDelta.from_bytes(wire))
        sparse.add_sparse(vec.size, vec.index, vec.values, w)
        dense.add(decode_delta(wire), w)
    np.testing.assert_allclose(sparse.result(), dense.result(), rtol=1e-5, atol=1e-6)
    # the sum travels on (a partial, a step) with only its nonzeros, losslessly at 32 bits
    total = sparse.result()
    np.testing.assert_array_equal(decode_delta(encode_nonzero(total, 32, chunk).to_bytes()), total)


def _hostile(size: int = 100, chunk: int = 64, counts: tuple[int, ...] = (2, 1), offsets: tuple[int, ...] = (3, 9, 5),
             codes: int | None = None, **meta_over: np.ndarray) -> bytes:
    """A hand-built 2-bit sparse delta whose parts may lie about each other."""
    total = len(offsets) if codes is None else codes
    meta = {"cfg": np.array([chunk, 2, 0], "<i8"), "count": np.array(counts, "<u2"),
            "offset": np.frombuffer(_pack(np.array(offsets, np.uint32), (chunk - 1).bit_length()), np.uint8),
            "scale": np.ones(len(counts), "<f4")}
    meta.update(meta_over)
    return EncodedDelta("sparse", size, _pack(np.zeros(total, np.uint32), 2), meta).to_bytes()


def test_a_well_formed_hand_built_delta_decodes() -> None:
    out = decode_delta(_hostile())
    assert np.flatnonzero(out).tolist() == [3, 9, 64 + 5]


@pytest.mark.parametrize("wire, why", [
    (_hostile(offsets=(3, 9, 40)), "out of range"),  # the tail chunk holds 100 - 64 = 36
    (_hostile(offsets=(9, 9, 5)), "duplicate"),
    (_hostile(offsets=(9, 3, 5)), "unsorted"),
    (_hostile(counts=(2, 1, 1)), "chunk counts"),  # more counts than chunks
    (_hostile(counts=(2, 40), offsets=(3, 9, *range(40))), "more entries"),  # 40 > 36 in the tail
    (_hostile(counts=(4, 1)), "packed bytes"),  # counts claim 5 entries, 3 offsets sent
    (_hostile(codes=7), "packed bytes"),  # payload for 7 values, 3 offsets
    (_hostile(cfg=np.array([64, 5, 0], "<i8")), "cfg"),
    (_hostile(cfg=np.array([0, 2, 0], "<i8")), "cfg"),
    (_hostile(cfg=np.array([64, 2, 9], "<i8")), "cfg"),
    (_hostile(scale=np.array([1.0, np.nan], "<f4")), "scale"),
    (_hostile(scale=np.array([1.0], "<f4")), "scale"),
    (_hostile(size=2**40), "chunk counts"),  # a size that lies: no 2**40 allocation
])
def test_hostile_sparse_input_is_rejected_cleanly(wire: bytes, why: str) -> None:
    with pytest.raises(AggregationError, match=why):
        decode_delta(wire)


def test_codec_parameters_are_bounded() -> None:
    for bad in ({"density": 0.0}, {"density": 1.5}, {"bits": 5}, {"chunk": 0}, {"chunk": 1 << 20},
                {"transform": "fft"}, {"transform": "dct", "chunk": 4096}):
        with pytest.raises(AggregationError):
            SparseCodec(**bad)  # type: ignore[arg-type]


def test_sixty_fourth_at_two_bits_is_over_100x_smaller_than_float32() -> None:
    vec = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    wire = SparseCodec(density=1 / 64, bits=2, chunk=4096).encode(vec).to_bytes()
    assert vec.nbytes / len(wire) > 100
    assert math.isclose(len(wire) / vec.size, (2 + 12) / 8 / 64, rel_tol=0.1)
