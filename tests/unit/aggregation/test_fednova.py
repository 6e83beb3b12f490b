"""FedNova: the normalised average against hand-computed vectors, and hierarchical == flat."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation import AggregationError, build_tree
from aggregation.fednova import (
    effective_norm,
    fednova_mean,
    hierarchical_fednova,
    normalise,
    step_norm,
)


def test_two_members_by_hand() -> None:
    # Member A: 100 samples, 10 steps, moved (10, 20). Member B: 300 samples, 2 steps, moved (2, -4).
    # p = (0.25, 0.75); normalised: A (1, 2), B (1, -2); direction = 0.25*(1,2) + 0.75*(1,-2) = (1, -1)
    # tau_eff = 0.25*10 + 0.75*2 = 4; update = 4 * (1, -1) = (4, -4).
    out = fednova_mean([np.array([10.0, 20.0]), np.array([2.0, -4.0])], [100, 300], [10, 2])
    np.testing.assert_allclose(out, [4.0, -4.0], rtol=1e-6)
    # Plain FedAvg would give 0.25*(10,20) + 0.75*(2,-4) = (4, 2): the fast member's 10 steps
    # pull the second coordinate its way. FedNova keeps each member's per-step direction.


def test_three_members_by_hand_with_momentum_norms() -> None:
    rho = 0.5
    # a(tau) = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)
    # a(1) = (1 - 0.5*0.5/0.5)/0.5 = 1; a(2) = (2 - 0.5*0.75/0.5)/0.5 = 2.5; a(4) = (4 - 0.5*0.9375/0.5)/0.5 = 6.125
    assert step_norm(1, rho) == pytest.approx(1.0)
    assert step_norm(2, rho) == pytest.approx(2.5)
    assert step_norm(4, rho) == pytest.approx(6.125)
    norms = [step_norm(t, rho) for t in (1, 2, 4)]
    deltas = [np.array([1.0, 0.0, 2.0]), np.array([5.0, 5.0, 0.0]), np.array([6.125, -12.25, 0.0])]
    samples = [2, 1, 1]
    # normalised: (1, 0, 2), (2, 2, 0), (1, -2, 0); p = (0.5, 0.25, 0.25)
    # direction = (0.5+0.5+0.25, 0+0.5-0.5, 1+0+0) = (1.25, 0, 1)
    # tau_eff = 0.5*1 + 0.25*2.5 + 0.25*6.125 = 2.65625; update = (3.3203125, 0, 2.65625)
    assert effective_norm(samples, norms) == pytest.approx(2.65625)
    np.testing.assert_allclose(fednova_mean(deltas, samples, norms), [3.3203125, 0.0, 2.65625], rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8), steps=st.integers(1, 5000), momentum=st.sampled_from([0.0, 0.5, 0.9]),
       seed=st.integers(0, 2**32 - 1))
def test_equal_steps_is_plain_fedavg(n: int, steps: int, momentum: float, seed: int) -> None:
    # With one step norm a for everyone: tau_eff = a, and a * sum p_i (d_i / a) = sum p_i d_i.
    rng = np.random.default_rng(seed)
    deltas = [(rng.standard_normal(5) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32) for _ in range(n)]
    samples = [float(rng.integers(1, 1000)) for _ in range(n)]
    norm = step_norm(steps, momentum)
    expected = np.average(np.asarray(deltas, dtype=np.float64), axis=0, weights=samples)
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(fednova_mean(deltas, samples, [norm] * n), expected, rtol=1e-5, atol=1e-5 * scale)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_the_update_is_the_formula(n: int, seed: int) -> None:
    # Against the paper's formula written out in float64, term by term.
    rng = np.random.default_rng(seed)
    deltas = [rng.standard_normal(4).astype(np.float32) for _ in range(n)]
    samples = [float(rng.integers(1, 100)) for _ in range(n)]
    norms = [step_norm(int(rng.integers(1, 300)), 0.9) for _ in range(n)]
    p = np.asarray(samples) / sum(samples)
    tau = sum(pi * ai for pi, ai in zip(p, norms, strict=True))
    expected = tau * sum(pi * d.astype(np.float64) / ai for pi, d, ai in zip(p, deltas, norms, strict=True))
    np.testing.assert_allclose(fednova_mean(deltas, samples, norms), expected, rtol=1e-5, atol=1e-6)


def test_sgd_norm_is_the_step_count() -> None:
    assert step_norm(13) == 13.0
    assert normalise(np.array([13.0, 26.0]), 13.0).tolist() == [1.0, 2.0]


@pytest.mark.parametrize(("steps", "momentum"), [(0, 0.0), (-1, 0.0), (float("nan"), 0.0), (2, 1.0), (3e7, 0.0)])
def test_bad_norm_arguments(steps: float, momentum: float) -> None:
    with pytest.raises(AggregationError):
        step_norm(steps, momentum)


def test_bad_mean_arguments() -> None:
    with pytest.raises(AggregationError, match="one sample weight"):
        fednova_mean([np.ones(2)], [1.0, 2.0], [1.0])
    with pytest.raises(AggregationError, match="zero"):
        effective_norm([0.0], [1.0])
    with pytest.raises(AggregationError):
        normalise(np.ones(2), 0.0)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 40), g=st.integers(2, 6), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_hierarchical_fednova_equals_flat(n: int, g: int, seed: int, data: st.DataObject) -> None:
    members = [f"peer-{i:03d}" for i in range(n)]
    root = data.draw(st.sampled_from(members))
    rng = np.random.default_rng(seed)
    present = [m for m in members if rng.random() < 0.8] or [root]
    deltas = {m: (rng.standard_normal(7) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32) for m in present}
    samples = {m: float(rng.integers(1, 1000)) for m in present}
    norms = {m: step_norm(int(rng.integers(1, 500)), float(rng.choice([0.0, 0.9]))) for m in present}
    tree = build_tree(members, g, root)
    flat = fednova_mean([deltas[m] for m in present], [samples[m] for m in present], [norms[m] for m in present])
    hier = hierarchical_fednova(tree, deltas, samples, norms)
    tol = 1e-5 * max(1.0, float(np.abs(flat).max()))
    np.testing.assert_allclose(hier, flat, rtol=1e-5, atol=tol)
