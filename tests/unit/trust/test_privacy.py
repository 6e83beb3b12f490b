"""The RDP accountant against published closed forms, and the budget policy."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from gpuflex.jobspec import JobSpec
from gpuflex.node.core.pipeline import DeltaEncoder
from gpuflex.privacy import STOP, WARN, budget_status, epsilon_for, epsilon_spent, noise_for_epsilon


def exact_gaussian_delta(eps: float, sigma: float) -> float:
    """Tight δ(ε) of one Gaussian mechanism, sensitivity 1 (Balle & Wang 2018, Theorem 8)."""
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
    return phi(-eps * sigma + 1 / (2 * sigma)) - math.exp(eps) * phi(-eps * sigma - 1 / (2 * sigma))


def test_rdp_of_the_gaussian_mechanism_is_alpha_over_two_sigma_squared() -> None:
    """Mironov 2017, Proposition 7: RDP of order α is α / (2σ²), and it composes additively."""
    orders = [2.0, 4.0, 8.0, 32.0]
    acc = rdp_privacy_accountant.RdpAccountant(orders)
    acc.compose(dp_accounting.GaussianDpEvent(2.0), 10)
    assert acc._rdp == pytest.approx([10 * a / (2 * 2.0**2) for a in orders])


@pytest.mark.parametrize(("sigma", "rounds"), [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_epsilon_between_the_tight_value_and_the_classic_bound(sigma: float, rounds: int) -> None:
    delta = 1e-5
    eps = epsilon_for(sigma, rounds, delta)
    # upper bound: the classic RDP conversion ε = Tα/(2σ²) + log(1/δ)/(α-1), best α
    alphas = np.linspace(1.01, 400, 40000)
    classic = float(np.min(rounds * alphas / (2 * sigma**2) + math.log(1 / delta) / (alphas - 1)))
    assert eps <= classic + 1e-6
    # lower bound: T Gaussian mechanisms = one with σ/√T; RDP can only over-estimate the tight ε
    assert exact_gaussian_delta(eps, sigma / math.sqrt(rounds)) <= delta * 1.0001


def test_published_value_one_gaussian_sigma_one() -> None:
    """σ = 1, δ = 1e-5: the tight ε is 4.377 (analytic Gaussian mechanism); RDP gives ≈ 4.73.

    The library's exact PLD accountant must reproduce the closed form, and its RDP accountant
    (what the node uses: cheap and composable) must stay within 10% above it.
    """
    assert exact_gaussian_delta(4.3772, 1.0) == pytest.approx(1e-5, rel=1e-3)
    pld = dp_accounting.pld.pld_privacy_accountant.PLDAccountant()
    assert pld.compose(dp_accounting.GaussianDpEvent(1.0)).get_epsilon(1e-5) == pytest.approx(4.3772, abs=1e-3)
    eps = epsilon_for(1.0, 1, 1e-5)
    assert 4.3772 < eps == pytest.approx(4.73, abs=0.02)


def test_spec_budget_and_noise_calibration() -> None:
    base = {"model": "mlp", "data": "sklearn-digits"}
    off = JobSpec.from_dict(base)
    assert epsilon_spent(off, 3) == math.inf and budget_status(off, 100) == "ok"
    on = JobSpec.from_dict({**base, "dp_clip": 1.0, "dp_noise_multiplier": 2.0, "dp_epsilon_budget": 4.0})
    assert epsilon_spent(on, 0) == 0.0 and epsilon_spent(on, 5) < epsilon_spent(on, 6)
    first_over = next(r for r in range(1, 200) if epsilon_spent(on, r) > 4.0)
    assert budget_status(on, first_over - 2) == "ok" and budget_status(on, first_over - 1) == STOP
    warn = JobSpec.from_dict({**on.to_dict(), "dp_on_budget": "warn"})
    assert budget_status(warn, first_over - 1) == WARN
    z = noise_for_epsilon(4.0, 20)
    assert epsilon_for(z, 20, 1e-5) <= 4.0 < epsilon_for(z * 0.97, 20, 1e-5)


def test_encoder_clips_and_noises() -> None:
    job = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "dp_clip": 0.5, "dp_noise_multiplier": 1.0})
    enc = DeltaEncoder(job, rng=np.random.default_rng(0))
    delta = np.full(40000, 1.0, dtype=np.float32)  # norm 200, clipped to 0.5
    out = np.frombuffer(enc.encode(delta), dtype="<f4")
    assert enc.last_clip_scale == pytest.approx(0.5 / 200)
    assert float(np.std(out)) == pytest.approx(0.5, rel=0.03)  # noise std z * C
    assert float(np.mean(out)) == pytest.approx(0.5 / 200, abs=0.01)
