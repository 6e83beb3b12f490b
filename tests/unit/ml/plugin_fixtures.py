"""Plug-ins that the tests name by import path, as a user's job file would."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

NOT_CALLABLE = 42


def tiny_model(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


def not_a_model() -> str:
    return "nope"


def needs_unknown_argument(flavour: str) -> nn.Module:
    raise AssertionError("never called")


def blobs() -> tuple[TensorDataset, TensorDataset]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=240)
    x = rng.normal(size=(240, 5)).astype(np.float32) + y[:, None] * 2.0
    t = torch.from_numpy
    return TensorDataset(t(x[:180]), t(y[:180])), TensorDataset(t(x[180:]), t(y[180:]))


def not_datasets() -> list[int]:
    return [1, 2, 3]


def counting_train(model: nn.Module, loader, settings: dict) -> dict:
    seen = sum(len(y) for _, y in loader)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    return {"samples": seen, "custom": settings["lr"]}


def bad_train(model: nn.Module, loader, settings: dict) -> float:
    return 0.5


def halves(labels, num_parts, scheme, *, alpha, shards_per_node, seed, groups):
    return np.array_split(np.arange(len(labels)), num_parts)
