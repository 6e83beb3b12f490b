"""Client drift correction: FedProx's proximal term, SCAFFOLD's control variates, FedDyn.

When each member holds a few classes, its local steps pull the model towards its own classes
and the average of those pulls is not the step central training would take ("client drift").
Both corrections act on the gradients of the member's own loop, between the backward pass and
the optimizer step (``steploop.run_steps``'s ``before_step``), so they work with every
optimizer, micro-batching, mixed precision and time budget:

- FedProx (Li et al. 2020) adds ``mu * (w - w_base)`` to each gradient: the gradient of
  ``mu/2 * ||w - w_base||²``, which keeps the member near the round's base model. No bytes.
- SCAFFOLD (Karimireddy et al. 2020) adds ``c - c_i``: the mesh's estimate of the full
  gradient less this member's own. With SGD (plain or momentum) ``c_i`` follows the paper's
  option II, ``c_i' = c_i - c + (x - y_i) / (lr * T)``, from the round's displacement ``x - y_i``
  and ``T``, how far the K steps actually taken carry a constant gradient (K without momentum;
  see :func:`sgd_steps_length`). With Adam it becomes the mean raw gradient of the round's
  steps (the trajectory form: option II needs a step that is linear in the gradient). The
  member sends ``c_i' - c_i`` after its model delta in one vector, so the tree, the codecs, DP
  and the robust rules treat it like the rest of the update; the root adds its mean to ``c``,
  which travels with the model as server-optimizer state (``aggregation.scaffold``). That
  doubles the bytes of an update, and only those.
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

from gpuflex.jobspec import JobSpec
from gpuflex.ml.train import sgd_settings


def sgd_steps_length(steps: int, momentum: float) -> float:
    """``T``: how far ``steps`` steps of torch's SGD carry the weights along a constant gradient,
    in units of ``lr`` times that gradient. The momentum buffer starts at the first gradient
    (no dampening), so the gradient of step j moves the weights by
    ``lr * (1 - momentum^(K-j)) / (1 - momentum)`` by the end of the round, and
    ``T = sum_j (1 - momentum^(K-j)) / (1 - momentum)``: K without momentum, about
    ``K / (1 - momentum)`` for many steps, far less for few."""
    if steps <= 0:
        return 0.0
    if momentum == 0.0:
        return float(steps)
    return (steps - momentum * (1.0 - momentum ** steps) / (1.0 - momentum)) / (1.0 - momentum)


class DriftCorrection:
    """One member's correction for one job; it keeps ``c_i`` between rounds.

    ``c_i`` lives in memory: a member that restarts starts again from zero (its first round
    after the restart is an uncorrected FedAvg step). The mesh's ``c`` still holds that
    member's share of its lost ``c_i``, and the restarted member adds its new one on top, so
    ``c`` stays off the mean of the members' ``c_i`` by that share from then on.

    ``sgd`` is the member's (lr, momentum) when it trains with SGD (:meth:`for_job` fills it
    in): SCAFFOLD then takes ``c_i`` by option II from the round's displacement. Without it
    (Adam) ``c_i`` is the round's mean raw gradient. The two agree for plain SGD without weight
    decay (with it, option II's ``c_i`` also holds the decay's gradient, which every member's
    step includes). With momentum the mean raw gradient over-counts the last steps' gradients,
    whose momentum has not yet moved the weights: the server step is then no longer a step
    along the new ``c`` (option II's identity ``x+ = x - lr * T * c+``). With momentum 0.9 on
    quadratics whose optima lie apart, that made SCAFFOLD end farther from the optimum than
    FedAvg, where option II reaches it (``tests/unit/ml/test_drift.py``).
    """

    def __init__(self, kind: str, mu: float = 0.0, sgd: tuple[float, float] | None = None) -> None:
        if kind not in ("fedprox", "scaffold", "feddyn"):
            raise ValueError(f"unknown drift correction {kind!r}")
        if sgd is not None and not (sgd[0] > 0 and 0.0 <= sgd[1] < 1.0):
            raise ValueError(f"SGD needs lr > 0 and momentum in [0, 1), got {sgd}")
        self.kind, self.mu, self.sgd = kind, float(mu), sgd
        self.local_control: np.ndarray | None = None  # c_i (SCAFFOLD) or h_i (FedDyn), flat float32
        self._slots: list[tuple[nn.Parameter | None, int]] = []
        self._grad_sum: list[torch.Tensor] = []  # trajectory form: the raw gradients' sum
        self._base: list[torch.Tensor] = []  # option II: the round's starting weights
        self._correction = np.zeros(0, dtype=np.float32)  # the round's c - c_i
        self._taken: list[torch.Tensor] = []  # per step: whether the optimizer took it

    @classmethod
    def for_job(cls, spec: JobSpec) -> DriftCorrection | None:
        """The job's correction with its member's optimizer; None without one."""
        if spec.drift_correction == "none":
            return None
        return cls(spec.drift_correction, spec.prox_mu, sgd_settings(spec))

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
        self._slots, self._correction, self._taken = slots, corr, []
        trajectory = self.sgd is None
        self._grad_sum = [torch.zeros_like(p) for p in params] if trajectory else []
        self._base = [] if trajectory else [p.detach().clone() for p in params]
        sums = self._grad_sum

        def scaffold() -> None:
            with torch.no_grad():
                grads = [p.grad for p in params if p.grad is not None]
                if not grads:
                    return
                # fp16's loss scaler skips a step whose gradients overflowed: that step moves
                # nothing and must not count, nor its inf reach c_i (which would stay non-finite
                # in every later round). Checked on the device, without waiting for it.
                ok = torch.stack([g.isfinite().all() for g in grads]).all()
                self._taken.append(ok)
                for i, (p, c) in enumerate(zip(params, pieces, strict=True)):
                    if p.grad is None:
                        continue
                    if trajectory:
                        sums[i].add_(torch.where(ok, p.grad, torch.zeros_like(p.grad)))
                    p.grad.add_(c.to(device=p.grad.device, dtype=p.grad.dtype))

        return scaffold

    def control_delta(self) -> np.ndarray:
        """After a SCAFFOLD round: ``c_i' - c_i`` (zero for buffers, which have none); ``c_i``
        becomes ``c_i'``. With SGD ``c_i' = (x - y_i) / (lr * T) - (c - c_i)``, option II; else
        the round's mean raw gradient. A round with no step taken changes nothing."""
        size = sum(n for _, n in self._slots)
        old = self.local_control if self.local_control is not None else np.zeros(size, dtype=np.float32)
        steps = int(torch.stack([t.cpu() for t in self._taken]).sum()) if self._taken else 0
        self._taken = []
        if not steps:
            self._base, self._grad_sum = [], []
            return np.zeros_like(old)
        if self.sgd is None:
            per_param = [s / steps for s in self._grad_sum]
        else:
            lr, momentum = self.sgd
            scale = 1.0 / (lr * sgd_steps_length(steps, momentum))
            moved = [(b - p.detach()) * scale for p, b in zip((p for p, _ in self._slots if p is not None),
                                                                self._base, strict=True)]
            per_param = [m - c.to(device=m.device, dtype=m.dtype)
                         for m, c in zip(moved, _pieces(self._slots, self._correction), strict=True)]
        self._base, self._grad_sum = [], []
        values = iter(per_param)
        parts = [next(values).reshape(-1).float().cpu() if p is not None else torch.zeros(n)
                 for p, n in self._slots]
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
