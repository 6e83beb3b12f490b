"""Hostile behaviours for robustness tests on loopback meshes (``--adversary KIND``).

A node started with an adversary still speaks the protocol correctly and signs its updates;
only the numbers it sends are poisoned, which is exactly the threat robust aggregation rules
must withstand. The flag is refused unless every listen address is on loopback.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("sign-flip", "scale", "gaussian", "little-is-enough", "label-flip")


@dataclass
class Adversary:
    kind: str
    factor: float = 10.0
    seed: int = 0

    def tamper(self, delta: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if self.kind == "sign-flip":
            return (-self.factor * delta).astype(np.float32)
        if self.kind == "scale":
            return (100.0 * self.factor * delta).astype(np.float32)
        if self.kind == "gaussian":
            scale = float(np.std(delta)) * self.factor or 1.0
            return rng.normal(0.0, scale, size=delta.shape).astype(np.float32)
        if self.kind == "little-is-enough":
            return (delta - 1.5 * np.abs(delta).mean() * np.sign(delta)).astype(np.float32)
        return delta  # label-flip poisons the data, not the delta


def make_adversary(kind: str) -> Adversary:
    if kind not in KINDS:
        raise ValueError(f"unknown adversary {kind!r}; choose from {', '.join(KINDS)}")
    return Adversary(kind)


def loopback_only(listen: list[str]) -> bool:
    return all(a.startswith("/ip4/127.") or a.startswith("/ip6/::1/") for a in listen)
