"""Drift correction in the member's loop: FedProx adds mu * (w - w_base) to each gradient,
SCAFFOLD adds c - c_i and learns c_i as the round's mean raw gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gpuflex.jobspec import JobSpec, JobSpecError
from gpuflex.ml.drift import DriftCorrection
from gpuflex.ml.params import flatten_params


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))


def _step(model: nn.Module, hook, x: torch.Tensor) -> np.ndarray:
    """One backward pass and the hook; returns the raw gradient (before the hook) flat."""
    model.zero_grad()
    model(x).sum().backward()
    raw = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]).numpy()
    hook()
    return raw


def _grads(model: nn.Module) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()


def test_fedprox_adds_mu_times_the_distance_from_the_base() -> None:
    model = _model()
    prox = DriftCorrection("fedprox", mu=0.5)
    base = flatten_params(model).copy()
    hook = prox.hook(model, None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.25)  # the member has moved away from the base
    raw = _step(model, hook, torch.ones(4, 3))
    moved = flatten_params(model) - base
    np.testing.assert_allclose(_grads(model), raw + 0.5 * moved, rtol=1e-6)
    assert not prox.sends_control


def test_scaffold_adds_c_minus_c_i_and_learns_c_i_as_the_mean_raw_gradient() -> None:
    model = _model()
    size = flatten_params(model).size
    scaffold = DriftCorrection("scaffold")
    rng = np.random.default_rng(1)
    # Round 1: no c, no c_i yet: the gradients are untouched.
    hook = scaffold.hook(model, None)
    raws = [_step(model, hook, torch.from_numpy(rng.normal(size=(4, 3)).astype(np.float32))) for _ in range(3)]
    np.testing.assert_allclose(_grads(model), raws[-1], rtol=1e-6)
    first = scaffold.control_delta()
    np.testing.assert_allclose(first, np.mean(raws, axis=0), rtol=1e-5, atol=1e-7)
    # Round 2 with the mesh's c: each gradient gets c - c_i.
    c = rng.normal(size=size).astype(np.float32)
    hook = scaffold.hook(model, c)
    raws2 = [_step(model, hook, torch.from_numpy(rng.normal(size=(4, 3)).astype(np.float32))) for _ in range(2)]
    np.testing.assert_allclose(_grads(model), raws2[-1] + c - first, rtol=1e-5, atol=1e-6)
    second = scaffold.control_delta()
    np.testing.assert_allclose(second, np.mean(raws2, axis=0) - first, rtol=1e-5, atol=1e-6)


def test_feddyn_adds_alpha_times_the_distance_less_h_i_and_h_i_drops_by_alpha_times_the_delta() -> None:
    model = _model()
    dyn = DriftCorrection("feddyn", mu=0.5)
    base = flatten_params(model).copy()
    # Round 1: no h_i yet, so the term is FedProx's.
    hook = dyn.hook(model, None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.25)
    raw = _step(model, hook, torch.ones(4, 3))
    np.testing.assert_allclose(_grads(model), raw + 0.5 * (flatten_params(model) - base), rtol=1e-6)
    delta = flatten_params(model) - base
    dyn.observe_delta(delta)
    h = -0.5 * delta
    np.testing.assert_allclose(dyn.local_control, h, rtol=1e-6)
    # Round 2 from a new base: alpha * (w - w_base) - h_i.
    base = flatten_params(model).copy()
    hook = dyn.hook(model, None)
    raw = _step(model, hook, torch.full((4, 3), 2.0))
    np.testing.assert_allclose(_grads(model), raw - h, rtol=1e-6, atol=1e-7)
    dyn.observe_delta(np.full(base.size, 0.1, np.float32))
    np.testing.assert_allclose(dyn.local_control, h - 0.05, rtol=1e-6, atol=1e-7)
    assert not dyn.sends_control
    with pytest.raises(ValueError, match="state"):
        dyn.observe_delta(np.zeros(3, np.float32))


def test_scaffold_refuses_a_control_variate_of_another_model() -> None:
    with pytest.raises(ValueError, match="control has 3 values"):
        DriftCorrection("scaffold").hook(_model(), np.zeros(3, np.float32))


def test_a_scaffold_member_sends_model_then_control_and_fedprox_sends_the_model_alone() -> None:
    from gpuflex.ml.workload import Workload
    from gpuflex.nodeconfig import NodeConfig

    for kind, factor in (("scaffold", 2), ("fedprox", 1), ("feddyn", 1), ("none", 1)):
        spec = JobSpec(model="mlp", data="sklearn-digits", partition="dirichlet", alpha=0.1, local_steps=2,
                       drift_correction=kind, strategy="fedavg")  # type: ignore[arg-type]
        node = Workload(spec, 0, 2, config=NodeConfig())
        base = node.initial_params()
        delta, _ = node.train(base)
        assert delta.size == factor * base.size and np.all(np.isfinite(delta))


@pytest.mark.parametrize(("extra", "message"), [
    ({"train_fn": "mylab.loops:train"}, "train_fn"),
    ({"model": "gpt2", "data": "text"}, "language-model jobs"),
    ({"compute_budget_s": 5.0}, "fednova"),
    ({"normalization": "fednova"}, "fednova"),
    ({"dp_clip": 1.0, "dp_noise_multiplier": 0.5}, "noise of all rounds"),
    ({"codec": "topk"}, "'topk' cannot be combined"),
    ({"codec": "sparse"}, "'sparse' cannot be combined"),
])
def test_the_job_file_refuses_scaffold_where_it_cannot_work(extra: dict, message: str) -> None:
    values = {"model": "digits-cnn", "data": "sklearn-digits", "drift_correction": "scaffold", **extra}
    with pytest.raises(JobSpecError, match=message):
        JobSpec.from_dict(values)


def test_scaffold_takes_the_codecs_and_bounds_that_keep_its_control_variates_whole() -> None:
    job = {"model": "digits-cnn", "data": "sklearn-digits", "drift_correction": "scaffold"}
    for codec in ("none", "fp16", "int8"):
        assert JobSpec.from_dict({**job, "codec": codec}).codec == codec
    assert JobSpec.from_dict({**job, "norm_bound": 1.0}).norm_bound == 1.0  # a bound on the whole update


def test_the_job_file_refuses_feddyn_with_dp_noise_or_a_server_optimizer() -> None:
    job = {"model": "digits-cnn", "data": "sklearn-digits", "drift_correction": "feddyn", "strategy": "fedavg"}
    with pytest.raises(JobSpecError, match="noise of"):
        JobSpec.from_dict({**job, "dp_clip": 1.0, "dp_noise_multiplier": 0.5})
    with pytest.raises(JobSpecError, match="needs strategy = 'fedavg'"):
        JobSpec.from_dict({**job, "strategy": "fedavgm"})
    with pytest.raises(JobSpecError, match="needs strategy = 'fedavg'"):
        JobSpec.from_dict({k: v for k, v in job.items() if k != "strategy"})
    assert JobSpec.from_dict({**job, "norm_bound": 1.0}).drift_correction == "feddyn"


def test_drift_settings_are_bounded_and_named() -> None:
    with pytest.raises(JobSpecError, match="drift_correction"):
        JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "drift_correction": "moon"})
    with pytest.raises(JobSpecError, match="prox_mu"):
        JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "prox_mu": 1e9})
    with pytest.raises(JobSpecError, match="final_model"):
        JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "final_model": "median"})
    spec = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "drift_correction": "fedprox",
                              "prox_mu": 0.1, "final_model": "last"})
    assert (spec.drift_correction, spec.prox_mu, spec.final_model) == ("fedprox", 0.1, "last")
