"""Importable model, data and training-loop functions for the SDK tests, as a user would write."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_model(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


def make_data() -> tuple[TensorDataset, TensorDataset]:
    """Three well separated Gaussian blobs: a few SGD steps reach high accuracy."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=300)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    x[np.arange(300), y] += 4.0
    t = torch.from_numpy
    return TensorDataset(t(x[:240]), t(y[:240])), TensorDataset(t(x[240:]), t(y[240:]))


def sgd_loop(model: nn.Module, loader: DataLoader, settings: dict[str, Any]) -> dict[str, Any]:
    """A user's own training loop: plain SGD over ``local_steps`` batches."""
    opt = torch.optim.SGD(model.parameters(), lr=settings["lr"])
    loss_fn = nn.CrossEntropyLoss()
    seen, total, steps = 0, 0.0, 0
    while steps < settings["local_steps"]:
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x.to(settings["device"])), y.to(settings["device"]))
            loss.backward()
            opt.step()
            seen, total, steps = seen + len(y), total + loss.item() * len(y), steps + 1
            if steps == settings["local_steps"]:
                break
    return {"samples": seen, "train_loss": total / max(seen, 1), "custom_loop": 1.0}


def not_a_model() -> str:
    return "a string, not an nn.Module"
