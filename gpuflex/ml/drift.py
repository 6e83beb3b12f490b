"""Client drift correction: FedProx's proximal term, SCAFFOLD's control variates, FedDyn.

When each member holds a few classes, its local steps pull the model towards its own classes
and the average of those pulls is not the step central training would take ("client drift").
Both corrections act on the gradients of the member's own loop, between the backward pass and
the optimizer step (``steploop.run_steps``'s ``before_step``), so they work with every
optimizer, micro-batching, mixed precision and time budget:

- FedProx (Li et al. 2020) adds ``mu * (w - w_base)`` to each gradient: the gradient of
  ``mu/2 * ||w - w_base||²``, which keeps the member near the round's base model. No bytes.
- SCAFFOLD (Karimireddy et al. 2020) adds ``c - c_i``: the mesh's estimate of the full
  gradient less this member's own. ``c_i`` becomes the mean raw gradient this member saw in
  the round (the trajectory form of the paper's option II, which needs no learning rate and so
  holds for momentum and Adam alike). The member sends ``c_i' - c_i`` after its model delta
  in one vector, so the tree, the codecs, DP and the robust rules treat it like the rest of the
  update; the root adds its mean to ``c``, which travels with the model as server-optimizer
  state (``aggregation.scaffold``). That doubles the bytes of an update, and only those.
- FedDyn (Acar et al. 2021) adds ``alpha * (w - w_base) - h_i``, the gradient of its dynamic
  regulariser, with ``alpha`` the job's ``prox_mu``; ``h_i`` (the member's running estimate of
  its own gradient, in memory) drops by ``alpha * Δ_i`` after each round. The root keeps the
  mesh's sum in the model's state (``aggregation.feddyn``). No bytes beyond the model delta.
  Under a lossy codec ``h_i`` follows the member's exact delta and the root's sum the decoded
  mean, so the two drift apart by the codec's error, as SCAFFOLD's ``c`` and ``c_i`` do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn


class DriftCorrection:
    """One member's correction for one job; it keeps ``c_i`` between rounds.

    ``c_i`` lives in memory: a member that restarts starts again from zero, which SCAFFOLD
    tolerates (its first round after the restart is an uncorrected FedAvg step).
    """

    def __init__(self, kind: str, mu: float = 0.0) -> None:
        if kind not in ("fedprox", "scaffold", "feddyn"):
            raise ValueError(f"unknown drift correction {kind!r}")
        self.kind, self.mu = kind, float(mu)
        self.local_control: np.ndarray | None = None  # c_i (SCAFFOLD) or h_i (FedDyn), flat float32
        self._slots: list[tuple[nn.Parameter | None, int]] = []
        self._grad_sum: list[torch.Tensor] = []
        self._steps = 0

    @property
    def sends_control(self) -> bool:
        """Whether the update carries a control-variate delta after the model delta."""
        return self.kind == "scaffold"

    def hook(self, model: nn.Module, control: np.ndarray | None) -> Callable[[], None]:
        """The ``before_step`` for one round of local training from the model's current
        weights (the round's base). ``control`` is the mesh's ``c`` (None: zero), laid out
        like the flat parameter vector (``gpuflex.ml.params``)."""
        slots = _flat_slots(model)
        params = [p for p, _ in slots if p is not None]
        if self.kind in ("fedprox", "feddyn"):
            base = [p.detach().clone() for p in params]
            mu = self.mu
            # FedDyn's linear term: -h_i, laid out like the parameters (none before round 2).
            linear = _pieces(slots, -self.local_control) if self.kind == "feddyn" and \
                self.local_control is not None else None
            self._slots = slots

            def prox() -> None:
                with torch.no_grad():
                    for i, (p, b) in enumerate(zip(params, base, strict=True)):
                        if p.grad is not None:
                            p.grad.add_(p.detach() - b, alpha=mu)
                            if linear is not None:
                                p.grad.add_(linear[i].to(device=p.grad.device, dtype=p.grad.dtype))

            return prox
        size = sum(n for _, n in slots)
        for name, vec in (("control", control), ("local control", self.local_control)):
            if vec is not None and vec.size != size:
                raise ValueError(f"{name} has {vec.size} values, the model {size}")
        corr = np.zeros(size, dtype=np.float32)
        if control is not None:
            corr += control
        if self.local_control is not None:
            corr -= self.local_control
        pieces = _pieces(slots, corr)
        self._slots = slots
        self._grad_sum = [torch.zeros_like(p) for p in params]
        self._steps = 0

        def scaffold() -> None:
            with torch.no_grad():
                for p, acc, c in zip(params, self._grad_sum, pieces, strict=True):
                    if p.grad is None:
                        continue
                    acc.add_(p.grad)
                    p.grad.add_(c.to(device=p.grad.device, dtype=p.grad.dtype))
            self._steps += 1

        return scaffold

    def control_delta(self) -> np.ndarray:
        """After a SCAFFOLD round: ``c_i' - c_i``, with ``c_i'`` the round's mean raw gradient
        (zero for buffers, which have none); ``c_i`` becomes ``c_i'``. A round with no step
        changes nothing."""
        size = sum(n for _, n in self._slots)
        old = self.local_control if self.local_control is not None else np.zeros(size, dtype=np.float32)
        if not self._steps:
            return np.zeros_like(old)
        sums = iter(self._grad_sum)
        parts = [(next(sums) / self._steps).reshape(-1).float().cpu() if p is not None
                 else torch.zeros(n) for p, n in self._slots]
        self.local_control = torch.cat(parts).numpy().astype(np.float32) if parts else old
        return (self.local_control - old).astype(np.float32)


    def observe_delta(self, delta: np.ndarray) -> None:
        """After a FedDyn round: ``h_i -= alpha * Δ_i`` (the model delta this member sends).
        Other kinds keep nothing of it."""
        if self.kind != "feddyn":
            return
        old = self.local_control if self.local_control is not None else np.zeros(delta.size, np.float32)
        if old.size != delta.size:
            raise ValueError(f"the delta has {delta.size} values, the member's state {old.size}")
        self.local_control = (old - np.float32(self.mu) * delta).astype(np.float32)


def _pieces(slots: list[tuple[nn.Parameter | None, int]], flat_values: np.ndarray) -> list[torch.Tensor]:
    """A flat vector (``gpuflex.ml.params`` layout) cut into views shaped like the trainable
    parameters, buffers' stretches skipped."""
    if flat_values.size != sum(n for _, n in slots):
        raise ValueError(f"the member's state has {flat_values.size} values, the model {sum(n for _, n in slots)}")
    flat = torch.from_numpy(np.ascontiguousarray(flat_values, dtype=np.float32))
    pieces, at = [], 0
    for p, n in slots:
        if p is not None:
            pieces.append(flat[at:at + n].view_as(p))
        at += n
    return pieces


def _flat_slots(model: nn.Module) -> list[tuple[nn.Parameter | None, int]]:
    """The flat vector's pieces in order (``gpuflex.ml.params``: the floating entries of the
    state_dict), each with its trainable parameter, or None for a buffer."""
    named = dict(model.named_parameters())
    return [(named.get(key) if named.get(key) is not None and named[key].requires_grad else None, v.numel())
            for key, v in model.state_dict().items() if v.is_floating_point()]
