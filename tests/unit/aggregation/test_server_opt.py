"""Server optimizers against hand-computed steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggregation import (
    AggregationError,
    DiLoCo,
    FedAdam,
    FedAvg,
    FedAvgM,
    ServerOptimizer,
    make_server_optimizer,
)


def _run(opt: ServerOptimizer, params: list[float], deltas: list[list[float]]) -> list[float]:
    p = np.array(params, np.float32)
    state: dict[str, np.ndarray] = {}
    trace = []
    for d in deltas:
        p, state = opt.step(p, np.array(d, np.float32), state)
        assert p.dtype == np.float32
        trace.append(float(p[0]))
    return trace


def test_fedavg() -> None:
    p, state = FedAvg(lr=0.5).step(np.array([1.0, 2.0]), np.array([2.0, -2.0]), {})
    np.testing.assert_allclose(p, [2.0, 1.0])
    assert state == {}


def test_fedavgm_three_steps() -> None:
    # m: 1 -> 0.5*1+1 = 1.5 -> 0.5*1.5-1 = -0.25; p accumulates m.
    trace = _run(FedAvgM(lr=1.0, momentum=0.5), [0.0], [[1.0], [1.0], [-1.0]])
    assert trace == pytest.approx([1.0, 2.5, 2.25])


def test_fedadam_two_steps() -> None:
    # step 1: m = 0.5*2 = 1, v = 0.5*4 = 2, p = 0.1 * 1 / (sqrt(2) + 1)
    # step 2 (delta 0): m = 0.5, v = 1, p += 0.1 * 0.5 / (1 + 1)
    trace = _run(FedAdam(lr=0.1, beta1=0.5, beta2=0.5, tau=1.0), [0.0], [[2.0], [0.0]])
    first = 0.1 / (math.sqrt(2) + 1)
    assert trace == pytest.approx([first, first + 0.025], rel=1e-6)


def test_diloco_two_steps() -> None:
    # g = -1; m = -1; p = 1 - 0.5*(-1 + 0.5*-1) = 1.75
    # g = -1; m = 0.5*-1 - 1 = -1.5; p = 1.75 - 0.5*(-1 + 0.5*-1.5) = 2.625
    trace = _run(DiLoCo(lr=0.5, momentum=0.5), [1.0], [[1.0], [1.0]])
    assert trace == pytest.approx([1.75, 2.625])


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam", "diloco"])
def test_steps_do_not_mutate_inputs(name: str) -> None:
    opt = make_server_optimizer(name)
    assert opt.name == name
    assert isinstance(opt, ServerOptimizer)
    params, delta = np.ones(3, np.float32), np.full(3, 0.5, np.float32)
    _, state = opt.step(params, delta, {})
    frozen = {k: v.copy() for k, v in state.items()}
    new, _ = opt.step(params, delta, state)
    assert params.tolist() == [1.0] * 3 and delta.tolist() == [0.5] * 3
    for key, value in state.items():
        np.testing.assert_array_equal(value, frozen[key])
    assert new.shape == (3,)


def test_state_travels_between_instances() -> None:
    # The root rotates: a fresh optimizer given the state must continue exactly.
    p, s = FedAvgM(momentum=0.5).step(np.zeros(2), np.ones(2), {})
    p2, _ = FedAvgM(momentum=0.5).step(p, np.ones(2), s)
    np.testing.assert_allclose(p2, [2.5, 2.5])


def test_factory_errors() -> None:
    with pytest.raises(AggregationError, match="fedavg, fedavgm, fedadam, diloco"):
        make_server_optimizer("sgd")
    with pytest.raises(AggregationError, match="bad parameters"):
        make_server_optimizer("fedavgm", momemtum=0.5)
    assert make_server_optimizer("FedAdam", lr=0.1).lr == 0.1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: FedAvg(lr=0), "lr"),
        (lambda: FedAvgM(momentum=1.0), "momentum"),
        (lambda: FedAdam(beta2=-0.1), "beta2"),
        (lambda: FedAdam(tau=0), "tau"),
        (lambda: DiLoCo(lr=float("nan")), "lr"),
    ],
)
def test_bad_hyper_parameters(factory: object, match: str) -> None:
    with pytest.raises(AggregationError, match=match):
        factory()  # type: ignore[operator]


def test_bad_step_inputs() -> None:
    opt = FedAvgM()
    with pytest.raises(AggregationError, match="shape"):
        opt.step(np.zeros(2), np.zeros(3), {})
    with pytest.raises(AggregationError, match="NaN"):
        opt.step(np.zeros(2), np.array([np.nan, 0.0]), {})
    with pytest.raises(AggregationError, match="state"):
        opt.step(np.zeros(2), np.zeros(2), {"m": np.zeros(5)})
