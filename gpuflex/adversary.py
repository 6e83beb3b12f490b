"""Hostile behaviours for robustness tests on loopback meshes (``--adversary KIND``).

A node started with an adversary still speaks the protocol correctly and signs its updates;
only the numbers it sends are poisoned, which is exactly the threat robust aggregation rules
must withstand. The flag is refused unless every listen address is on loopback.

Each attacker sees only its own delta (no collusion channel), so the attacks that, in the
literature, use the honest updates' statistics are approximated from the attacker's own:

- ``sign-flip``: sends -k × its delta (k = 4).
- ``scale``: sends its delta × 100, the "boosting" attack plain FedAvg cannot absorb.
- ``gaussian``: sends pure noise, with 10× the spread of its own delta.
- ``little-is-enough`` (Baruch et al. 2019): moves every coordinate by z = 1.5 "standard
  deviations" against its own sign. The paper takes the per-coordinate mean and std of all
  honest updates; we use the attacker's delta as the mean and its mean |coordinate| as the
  std, which keeps the update inside the honest spread (its norm is close to an honest one)
  while pushing every coordinate the wrong way.
- ``label-flip``: trains honestly on labels y -> C - 1 - y; the delta goes out untouched.
  It needs the data hook (``data_hook``) to be passed to the node's Workload.

A serving node can lie too, for the redundancy check's tests (``gpuflex.serve.check``): with
``GPUFLEX_TEST_SERVE_ADVERSARY=wrong-tokens`` in *its own* environment, and only when it listens
on loopback, it negates its models' logits before picking each token, so it answers with the
least likely tokens (made-up text, signed as its answer) while speaking the protocol correctly.
Nothing a peer sends can turn this on: it is read from the process's environment when a model
is loaded, never from the wire or from a file a peer names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("sign-flip", "scale", "gaussian", "little-is-enough", "label-flip")
SIGN_FLIP_K = 4.0
SCALE_FACTOR = 100.0
NOISE_FACTOR = 10.0
LIE_Z = 1.5


@dataclass
class Adversary:
    kind: str
    seed: int = 0
    rounds: int = 0

    def tamper(self, delta: np.ndarray) -> np.ndarray:
        """The poisoned delta this node sends instead of ``delta``."""
        self.rounds += 1
        delta = np.asarray(delta, dtype=np.float32)
        if self.kind == "sign-flip":
            return (-SIGN_FLIP_K * delta).astype(np.float32)
        if self.kind == "scale":
            return (SCALE_FACTOR * delta).astype(np.float32)
        if self.kind == "gaussian":
            rng = np.random.default_rng((self.seed, self.rounds))
            scale = float(np.std(delta)) * NOISE_FACTOR or 1.0
            return rng.normal(0.0, scale, size=delta.shape).astype(np.float32)
        if self.kind == "little-is-enough":
            sigma = float(np.abs(delta).mean())
            return (delta - LIE_Z * sigma * np.sign(delta)).astype(np.float32)
        return delta  # label-flip poisons the data, not the delta

    def data_hook(self) -> Callable[[Any], Any] | None:
        """Wraps the node's training set (label-flip only); None for the delta attacks."""
        return flip_labels if self.kind == "label-flip" else None

    def after_masking(self, ctx: Any, me: str) -> None:
        """An adversary sends its poisoned update like any member: nothing happens here."""
        return None


def flip_labels(dataset: Any, num_classes: int | None = None) -> Any:
    """A view of ``dataset`` whose labels are mapped y -> C - 1 - y (torch imported lazily)."""
    from torch.utils.data import Dataset

    classes = num_classes or _num_classes(dataset)

    class LabelFlipped(Dataset):
        def __len__(self) -> int:
            return len(dataset)

        def __getitem__(self, index: int) -> Any:
            x, y = dataset[index]
            return x, (classes - 1 - y)

    return LabelFlipped()


def _num_classes(dataset: Any) -> int:
    """Number of classes seen in the labels (digits: 10), scanning the dataset once."""
    labels = [int(dataset[i][1]) for i in range(len(dataset))]
    return max(labels) + 1 if labels else 1


def make_adversary(kind: str) -> Adversary:
    if kind not in KINDS:
        raise ValueError(f"unknown adversary {kind!r}; choose from {', '.join(KINDS)}")
    return Adversary(kind)


def loopback_only(listen: list[str]) -> bool:
    return all(a.startswith("/ip4/127.") or a.startswith("/ip6/::1/") for a in listen)


#: The environment variable a test node's operator sets to make it serve wrong answers.
SERVE_ENV = "GPUFLEX_TEST_SERVE_ADVERSARY"
SERVE_KINDS = ("wrong-tokens",)


def serve_tamper(listen: Sequence[str], environ: Mapping[str, str] = os.environ) -> Callable[[Any], Any] | None:
    """The logits tamper of a lying test server, or None (every real node). ValueError, with
    the reason, for an unknown kind or a node that listens beyond loopback."""
    kind = environ.get(SERVE_ENV, "").strip()
    if not kind:
        return None
    if kind not in SERVE_KINDS:
        raise ValueError(f"{SERVE_ENV}={kind[:40]!r}: unknown; choose from {', '.join(SERVE_KINDS)}")
    if not listen or not loopback_only(list(listen)):
        raise ValueError(f"{SERVE_ENV} is only allowed on loopback test meshes (listen on 127.0.0.1)")
    return negate_logits


def negate_logits(logits: Any) -> Any:
    """The least likely token becomes the most likely (a torch tensor in, one out)."""
    return -logits
