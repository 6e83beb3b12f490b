"""Flat parameter vectors: exact round trip, int buffers left alone, shape checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gpuflex.ml.params import flatten_params, load_flat_params, state_dict_from_flat


def test_round_trip_is_exact():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    vec = flatten_params(model)
    assert vec.dtype == np.float32
    # Weights and float buffers (running stats) count; num_batches_tracked (int) does not.
    expected = sum(v.numel() for v in model.state_dict().values() if v.is_floating_point())
    assert vec.shape == (expected,)
    new = np.arange(expected, dtype=np.float32)
    load_flat_params(model, new)
    assert np.array_equal(flatten_params(model), new)
    state = state_dict_from_flat(model, new)
    assert state["1.num_batches_tracked"].dtype == torch.long
    other = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    other.load_state_dict(state)
    assert np.array_equal(flatten_params(other), new)


def test_wrong_length_is_rejected():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"expected \(6,\)"):
        load_flat_params(model, np.zeros(5, dtype=np.float32))
