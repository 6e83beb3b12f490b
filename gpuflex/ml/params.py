"""Model weights as one flat float32 vector, the unit that the mesh hashes, ships and averages.

Order follows ``state_dict()``, which is deterministic for a given architecture, so every node
flattens the same model the same way. Floating-point buffers (running statistics, for
example) are included because they are part of what the model computes with. Integer
buffers, such as BatchNorm's ``num_batches_tracked``, are skipped: averaging a counter is
meaningless and a float32 cast could corrupt large values. They keep whatever value the local
model holds. The built-in models avoid BatchNorm, so for them the vector is the whole state.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn


def _float_items(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]


def num_flat_params(model: nn.Module) -> int:
    """Length of the flat vector, for sizing and for checking vectors that come off the wire."""
    return sum(v.numel() for _, v in _float_items(model))


def flatten_params(model: nn.Module) -> np.ndarray:
    """Copy every floating tensor of the state into one contiguous float32 vector."""
    parts = [v.detach().reshape(-1).to("cpu", torch.float32) for _, v in _float_items(model)]
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return torch.cat(parts).numpy().astype(np.float32, copy=False)


def _check_length(model: nn.Module, vec: np.ndarray) -> np.ndarray:
    vec = np.asarray(vec)
    expected = num_flat_params(model)
    if vec.ndim != 1 or vec.shape[0] != expected:
        raise ValueError(
            f"parameter vector has shape {vec.shape}, expected ({expected},) for this model"
        )
    return vec


def as_tensor(vec: np.ndarray) -> torch.Tensor:
    """A float32 CPU tensor sharing ``vec``'s memory, also when ``vec`` is a read-only view
    into a model blob (torch warns about those; every caller here only reads from it)."""
    vec = np.ascontiguousarray(vec, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(vec)


def state_dict_from_flat(model: nn.Module, vec: np.ndarray) -> dict[str, torch.Tensor]:
    """A fresh CPU state_dict holding ``vec``; integer buffers are copied from ``model``."""
    vec = _check_length(model, vec)
    flat = as_tensor(vec)
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            n = value.numel()
            out[key] = flat[offset : offset + n].reshape(value.shape).to(value.dtype).clone()
            offset += n
        else:
            out[key] = value.detach().to("cpu").clone()
    return out


def load_flat_params(model: nn.Module, vec: np.ndarray) -> None:
    """Write ``vec`` into the model in place, on whatever device the model lives."""
    vec = _check_length(model, vec)
    flat = as_tensor(vec)
    offset = 0
    with torch.no_grad():
        for _, value in _float_items(model):
            n = value.numel()
            value.copy_(flat[offset : offset + n].reshape(value.shape))
            offset += n
