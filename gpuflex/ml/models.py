"""Built-in models and the model plug-in contract.

Every node builds the model itself and must arrive at bit-identical initial weights, because
round 0's base model is never shipped: it is rebuilt from the seed. Initialisation therefore
runs under a forked, seeded torch RNG, which also leaves the caller's RNG untouched.
The built-ins avoid BatchNorm so that the flat parameter vector is the entire model state.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator

import torch
from torch import nn

from gpuflex.jobspec import JobSpec
from gpuflex.ml.datasets import DataBundle
from gpuflex.plugins import PluginError, call_with_accepted, is_plugin_path, load_callable

_SEEDED_BUILD = threading.Lock()


class DigitsCNN(nn.Module):
    """Two 3×3 convolutions and one pooling for 8×8 digits: about 38k parameters, enough for
    ~97% accuracy and cheap enough to train in well under a second per round on one core."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 16, 64),
            nn.ReLU(),
            nn.Linear(64, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Cifar10CNN(nn.Module):
    """The classic small CIFAR CNN of the FedAvg paper (two conv-pool blocks, two dense)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 256),
            nn.ReLU(),
            nn.Linear(256, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MLP(nn.Module):
    """Two hidden layers over flattened input; the width of the input comes from the data."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CharGRU(nn.Module):
    """Embedding, one GRU layer and a linear read-out of the last step: predicts the next
    character of a sequence (LEAF's Shakespeare task, smaller so it trains on a CPU)."""

    def __init__(self, vocab_size: int, embed: int = 32, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.gru = nn.GRU(embed, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.gru(self.embed(x))
        return self.out(hidden[:, -1])


def _digits(info: DataBundle) -> nn.Module:
    return DigitsCNN(info.num_classes)


def _cifar(info: DataBundle) -> nn.Module:
    return Cifar10CNN(info.num_classes, in_channels=info.input_shape[0])


def _mlp(info: DataBundle) -> nn.Module:
    return MLP(math.prod(info.input_shape), info.num_classes)


def _gru(info: DataBundle) -> nn.Module:
    return CharGRU(info.num_classes)


BUILDERS: dict[str, Callable[[DataBundle], nn.Module]] = {
    "digits-cnn": _digits,
    "cifar10-cnn": _cifar,
    "mlp": _mlp,
    "char-gru": _gru,
}


@contextlib.contextmanager
def seeded_build(seed: int) -> Iterator[None]:
    """Build under torch's RNG seeded with ``seed``, leaving the caller's RNG untouched.

    torch's generator is process-global: nodes sharing a process (an in-process mesh) must
    not interleave their seeded builds, or they start from different weights.
    """
    with _SEEDED_BUILD, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_model(spec: JobSpec, data_info: DataBundle) -> nn.Module:
    """Build the job's model with weights that depend only on ``spec.seed``.

    A plug-in is called with whichever of ``num_classes`` and ``input_shape`` it asks for.
    """
    with seeded_build(spec.seed):
        if is_plugin_path(spec.model):
            fn = load_callable(spec.model, "model")
            model = call_with_accepted(
                fn, "model", num_classes=data_info.num_classes, input_shape=data_info.input_shape
            )
            if not isinstance(model, nn.Module):
                raise PluginError(
                    f"model {spec.model!r} returned {type(model).__name__}, "
                    "expected a torch.nn.Module"
                )
        else:
            try:
                model = BUILDERS[spec.model](data_info)
            except KeyError:
                raise PluginError(f"unknown built-in model {spec.model!r}") from None
    return model.float()
