"""Drift correction in the member's loop: FedProx adds mu * (w - w_base) to each gradient,
SCAFFOLD adds c - c_i and learns c_i as the round's mean raw gradient."""

from __future__ import annotations

from typing import Any

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
    raw = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters() if p.grad is not None]).numpy()
    hook()
    return raw


def _grads(model: nn.Module) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).numpy()


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
    assert dyn.local_control is not None
    np.testing.assert_allclose(dyn.local_control, h, rtol=1e-6)
    # Round 2 from a new base: alpha * (w - w_base) - h_i.
    base = flatten_params(model).copy()
    hook = dyn.hook(model, None)
    raw = _step(model, hook, torch.full((4, 3), 2.0))
    np.testing.assert_allclose(_grads(model), raw - h, rtol=1e-6, atol=1e-7)
    dyn.observe_delta(np.full(base.size, 0.1, np.float32))
    assert dyn.local_control is not None
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


class _Quadratic(nn.Module):
    """f(x) = mean over rows of 0.5 * (a . x - b)^2 for a batch (A, b)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.zeros(dim))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return rows @ self.x


def _federated_quadratics(kind: str, optimizer: str, rounds: int = 30, local_steps: int = 10,
                          lr: float = 0.008) -> float:
    """Rounds of full participation over four members whose least-squares optima lie far
    apart, through the product's own pieces: the job's local SGD (``make_optimizer``), the step
    loop with the drift hook, the root's sample-weighted reducer and its server step. Returns
    the distance of the global model from the optimum of the union, relative to the optimum."""
    from gpuflex.ml.steploop import run_steps
    from gpuflex.ml.train import make_optimizer, plain_fit
    from gpuflex.node.core.outerstep import outer_step
    from gpuflex.node.core.pipeline import MeanReducer

    rng = np.random.default_rng(0)
    dim, rows = 5, (4, 8, 16, 8)  # unequal sample counts: the mean is sample-weighted
    data = [(torch.tensor(rng.normal(size=(n, dim)) * (1 + i), dtype=torch.float32),
             torch.tensor(rng.normal(size=n) * 5 + 3 * i, dtype=torch.float32)) for i, n in enumerate(rows)]
    optimum = np.linalg.lstsq(np.concatenate([a.double().numpy() for a, _ in data]),
                              np.concatenate([b.double().numpy() for _, b in data]), rcond=None)[0]
    spec = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "strategy": "fedavg", "server_lr": 1.0,
                              "drift_correction": kind, "optimizer": optimizer, "lr": lr,
                              "local_steps": local_steps, "local_epochs": 0})
    model = _Quadratic(dim)
    fit = plain_fit(torch.device("cpu"), max(rows))
    members = [DriftCorrection.for_job(spec) for _ in data]
    params = flatten_params(model).copy()
    state: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        reducer = MeanReducer()
        for (a, b), drift in zip(data, members, strict=True):
            model.x.data.copy_(torch.from_numpy(params))
            hook = drift.hook(model, state.get("scaffold_c")) if drift is not None else None

            def loss_of(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
                return 0.5 * ((model(batch[0]) - batch[1]) ** 2).mean(), len(batch[1])

            run_steps([(a, b)] * local_steps, fit, make_optimizer(model, spec), loss_of, before_step=hook)
            delta = flatten_params(model) - params
            if drift is not None:
                delta = np.concatenate([delta, drift.control_delta()])
            reducer.add(delta.astype(np.float32), float(len(b)), "member")
        params, state, _ = outer_step(spec, params, state, reducer.result())
    return float(np.linalg.norm(params - optimum) / np.linalg.norm(optimum))


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_scaffold_reaches_the_optimum_of_skewed_quadratics_where_fedavg_drifts(optimizer: str) -> None:
    """SCAFFOLD's promise (Karimireddy et al. 2020): with the members' optima far apart and ten
    local steps a round, FedAvg settles away from the optimum of the union and SCAFFOLD does
    not. With momentum SGD the mean raw gradient as c_i (the former trajectory form) ended
    farther from it than FedAvg (2.6 against 0.61); option II with the steps' true length
    lands on it."""
    fedavg = _federated_quadratics("none", optimizer)
    scaffold = _federated_quadratics("scaffold", optimizer)
    assert fedavg > 0.05  # the drift is there to correct
    assert scaffold < 0.01 and scaffold < fedavg / 20, (fedavg, scaffold)


def test_option_two_counts_the_steps_taken_and_the_momentum_that_carried_them() -> None:
    """c_i' = c_i - c + (x - y) / (lr * T), T = sum_j (1 - m^(K-j)) / (1 - m): with a constant
    gradient g the new c_i is exactly g, whatever the momentum."""
    from gpuflex.ml.drift import sgd_steps_length

    assert sgd_steps_length(0, 0.9) == 0.0
    assert sgd_steps_length(7, 0.0) == 7.0
    assert sgd_steps_length(3, 0.5) == pytest.approx((1 - 0.125) / 0.5 + (1 - 0.25) / 0.5 + (1 - 0.5) / 0.5)
    assert sgd_steps_length(2000, 0.9) == pytest.approx(2000 / 0.1, rel=1e-2)
    for momentum in (0.0, 0.9):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        drift = DriftCorrection("scaffold", sgd=(0.1, momentum))
        c = np.full(flatten_params(model).size, 0.25, np.float32)
        hook = drift.hook(model, c)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
        for _ in range(4):
            opt.zero_grad()
            model(torch.ones(1, 3)).sum().backward()  # a linear model: the same gradient each step
            hook()
            opt.step()
        np.testing.assert_allclose(drift.control_delta(), np.ones(4, np.float32), rtol=1e-4)


@pytest.mark.parametrize("sgd", [None, (0.01, 0.9)])
def test_a_step_the_fp16_loss_scaler_skips_leaves_c_i_finite_and_uncounted(
        sgd: tuple[float, float] | None) -> None:
    """fp16 starts its loss scale at 65536, so a first step overflows and the scaler skips it;
    its inf gradients used to be summed into c_i, which stayed non-finite from then on."""
    from gpuflex.ml.drift import sgd_steps_length
    from gpuflex.ml.fit import DeviceFit
    from gpuflex.ml.steploop import run_steps

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    fit = DeviceFit(device="cpu", name="cpu", capability=None, precision="fp16", batch_size=8,
                    micro_batch=8, threads=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    taken: list[int] = []
    step = opt.step

    def counted(*args: Any, **kwargs: Any) -> Any:  # the scaler calls it only for a step it takes
        taken.append(1)
        return step(*args, **kwargs)

    opt.step = counted  # type: ignore[method-assign]
    x, y = torch.randn(8, 4), torch.full((8,), 10.0)
    base = flatten_params(model).copy()
    drift = DriftCorrection("scaffold", sgd=sgd)
    hook = drift.hook(model, None)
    run_steps([(x, y)] * 8, fit, opt, lambda b: (((model(b[0]).squeeze(-1) - b[1]) ** 2).mean(), 8),
              before_step=hook)
    assert 0 < len(taken) < 8  # some steps overflowed and were skipped, the others were taken
    delta = drift.control_delta()
    assert np.all(np.isfinite(delta)) and np.any(delta != 0)
    if sgd is not None:
        moved = (base - flatten_params(model)) / (0.01 * sgd_steps_length(len(taken), 0.9))
        np.testing.assert_allclose(delta, moved, rtol=1e-4, atol=1e-6)
