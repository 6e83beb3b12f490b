"""The fragment-wise outer sync's math (aggregation.fragments): the split, which fragment a
round syncs, the merge of a member's own model, and error feedback kept per fragment."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation.compression import ErrorFeedback, make_codec
from aggregation.errors import AggregationError
from aggregation.fragments import fragment_bounds, fragment_index, round_span, synced_since

sizes = st.integers(min_value=1, max_value=5_000)
counts = st.integers(min_value=1, max_value=64)


@settings(max_examples=200, deadline=None)
@given(size=sizes, fragments=counts)
def test_the_split_covers_every_parameter_exactly_once_in_balanced_contiguous_fragments(size, fragments) -> None:
    spans = fragment_bounds(size, fragments)
    assert len(spans) == min(size, fragments)
    covered = np.zeros(size, dtype=int)
    for span in spans:
        assert span.size == size and span.length >= 1
        covered[span.start:span.stop] += 1
    assert np.all(covered == 1)
    assert [s.start for s in spans] == [0, *(s.stop for s in spans[:-1])]  # in order, back to back
    assert max(s.length for s in spans) - min(s.length for s in spans) <= 1
    assert fragment_bounds(size, fragments) == spans  # the model's size alone decides it


@settings(max_examples=100, deadline=None)
@given(size=sizes, fragments=counts, first=st.integers(min_value=1, max_value=10_000))
def test_rounds_sync_the_fragments_in_turn(size, fragments, first) -> None:
    count = min(size, fragments)
    turn = [round_span(size, fragments, r) for r in range(first, first + count)]
    assert sorted(s.start for s in turn) == [s.start for s in fragment_bounds(size, fragments)]
    assert round_span(size, fragments, first + count) == turn[0]
    assert fragment_index(1, fragments, size) == 0
    assert round_span(size, 1, first).whole


def test_a_bad_split_is_refused() -> None:
    with pytest.raises(AggregationError):
        fragment_bounds(0, 4)
    with pytest.raises(AggregationError):
        fragment_bounds(10, 0)


@settings(max_examples=100, deadline=None)
@given(size=st.integers(min_value=1, max_value=300), fragments=st.integers(min_value=1, max_value=8),
       first=st.integers(min_value=1, max_value=20), synced=st.integers(min_value=0, max_value=10))
def test_merging_takes_the_synced_fragments_from_the_committed_model_and_keeps_the_rest(
        size, fragments, first, synced) -> None:
    rng = np.random.default_rng(size * 31 + fragments)
    local, committed = rng.normal(size=size).astype(np.float32), rng.normal(size=size).astype(np.float32)
    before = local.copy()
    out = synced_since(local, committed, fragments, first, first + synced - 1)
    assert np.array_equal(local, before), "the own model is not changed in place"
    taken = np.zeros(size, dtype=bool)
    for r in range(first, first + synced):
        span = round_span(size, fragments, r)
        taken[span.start:span.stop] = True
    assert np.array_equal(out[taken], committed[taken])
    assert np.array_equal(out[~taken], local[~taken])
    if synced >= min(size, fragments):
        assert np.array_equal(out, committed), "every fragment synced since: the committed model"


def test_merging_refuses_models_of_different_sizes() -> None:
    with pytest.raises(AggregationError):
        synced_since(np.zeros(4, np.float32), np.zeros(5, np.float32), 2, 1, 1)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**16), fragments=st.integers(min_value=2, max_value=6))
def test_error_feedback_keeps_each_fragments_residual_until_that_fragment_is_sent_again(seed, fragments) -> None:
    """With decay 1, what a fragment sent plus what it holds back is every delta it was given
    plus what it held before; the rest of the residual waits untouched."""
    rng = np.random.default_rng(seed)
    size = 256
    codec = make_codec("topk", fraction=0.1)
    feedback = ErrorFeedback(codec)
    held = np.zeros(size, dtype=np.float32)
    for r in range(1, 2 * fragments + 1):
        span = round_span(size, fragments, r)
        delta = rng.normal(size=span.length).astype(np.float32)
        before = held.copy()
        sent = codec.decode(feedback.compress_span(delta, span.start, size))
        assert feedback.residual is not None and feedback.residual.size == size
        held = feedback.residual
        outside = np.ones(size, dtype=bool)
        outside[span.start:span.stop] = False
        assert np.array_equal(held[outside], before[outside])
        np.testing.assert_allclose(sent + held[span.start:span.stop], delta + before[span.start:span.stop],
                                   rtol=1e-5, atol=1e-5)


def test_error_feedback_refuses_a_fragment_outside_the_model() -> None:
    with pytest.raises(AggregationError):
        ErrorFeedback(make_codec("int8")).compress_span(np.ones(10, np.float32), 95, 100)
