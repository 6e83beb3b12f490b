"""Server optimizers: how the root turns the averaged delta into the next model.

The root changes every round, so no optimizer may keep state on itself:
``step`` takes the state (momentum buffers) in and hands the new state back,
and the node ships it alongside the model. Steps never mutate their inputs,
because the same arrays may back a ledger entry or a blob being served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from aggregation._checks import as_vector, check_number
from aggregation.errors import AggregationError

State = dict[str, np.ndarray]


@runtime_checkable
class ServerOptimizer(Protocol):
    """Applies one round's averaged delta (new_local - base) to the parameters."""

    @property
    def name(self) -> str: ...

    def step(self, params: np.ndarray, delta: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        """Return (new params, new state); ``state`` is {} on the first round."""
        ...


def _inputs(
    params: np.ndarray, delta: np.ndarray, state: Mapping[str, np.ndarray], keys: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], tuple[int, ...]]:
    """Validate a step's arrays; missing state buffers start at zero."""
    shape = np.shape(params)
    if np.shape(delta) != shape:
        raise AggregationError(f"delta has shape {np.shape(delta)}, params have {shape}")
    p = as_vector(params, "params")
    d = as_vector(delta, "delta")
    bufs = []
    for key in keys:
        if key not in state:
            bufs.append(np.zeros_like(d))
            continue
        buf = as_vector(state[key], f"state[{key!r}]")
        if buf.size != d.size:
            raise AggregationError(f"state[{key!r}] has {buf.size} elements, params have {d.size}")
        bufs.append(buf)
    return p, d, bufs, shape


@dataclass(frozen=True)
class FedAvg:
    """params + lr * delta: plain FedAvg when lr = 1 (McMahan et al. 2017)."""

    lr: float = 1.0
    name: str = field(default="fedavg", init=False)

    def __post_init__(self) -> None:
        check_number(self.lr, "lr", low=0.0, low_open=True)

    def step(self, params: np.ndarray, delta: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        p, d, _, shape = _inputs(params, delta, state, ())
        return (p + np.float32(self.lr) * d).reshape(shape), {}


@dataclass(frozen=True)
class FedAvgM:
    """Server momentum (Hsu et al. 2019): m = momentum * m + delta; params + lr * m."""

    lr: float = 1.0
    momentum: float = 0.9
    name: str = field(default="fedavgm", init=False)

    def __post_init__(self) -> None:
        check_number(self.lr, "lr", low=0.0, low_open=True)
        check_number(self.momentum, "momentum", low=0.0, high=1.0, high_open=True)

    def step(self, params: np.ndarray, delta: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        p, d, (m,), shape = _inputs(params, delta, state, ("m",))
        m = np.float32(self.momentum) * m + d
        return (p + np.float32(self.lr) * m).reshape(shape), {"m": m.reshape(shape)}


@dataclass(frozen=True)
class FedAdam:
    """FedAdam of Reddi et al. 2021, without bias correction as in the paper.

    Buffers start at zero (as Flower does); tau > 0 keeps the first step
    finite and bounds the step to about lr per coordinate.
    """

    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    name: str = field(default="fedadam", init=False)

    def __post_init__(self) -> None:
        check_number(self.lr, "lr", low=0.0, low_open=True)
        check_number(self.beta1, "beta1", low=0.0, high=1.0, high_open=True)
        check_number(self.beta2, "beta2", low=0.0, high=1.0, high_open=True)
        check_number(self.tau, "tau", low=0.0, low_open=True)

    def step(self, params: np.ndarray, delta: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        p, d, (m, v), shape = _inputs(params, delta, state, ("m", "v"))
        b1, b2 = np.float32(self.beta1), np.float32(self.beta2)
        m = b1 * m + (np.float32(1) - b1) * d
        v = b2 * v + (np.float32(1) - b2) * (d * d)
        new = p + np.float32(self.lr) * m / (np.sqrt(v) + np.float32(self.tau))
        return new.reshape(shape), {"m": m.reshape(shape), "v": v.reshape(shape)}


@dataclass(frozen=True)
class DiLoCo:
    """Outer Nesterov SGD on the pseudo-gradient g = -delta (Douillard et al. 2023).

    m = mu * m + g; params - lr * (g + mu * m). The defaults are the paper's.
    """

    lr: float = 0.7
    momentum: float = 0.9
    name: str = field(default="diloco", init=False)

    def __post_init__(self) -> None:
        check_number(self.lr, "lr", low=0.0, low_open=True)
        check_number(self.momentum, "momentum", low=0.0, high=1.0, high_open=True)

    def step(self, params: np.ndarray, delta: np.ndarray, state: State) -> tuple[np.ndarray, State]:
        p, d, (m,), shape = _inputs(params, delta, state, ("m",))
        mu = np.float32(self.momentum)
        # The same float operations as m = mu*m + g; p - lr*(g + mu*m) with g = -d, written
        # into two new vectors only: at 100M parameters each temporary is 400 MB.
        m_new = np.multiply(m, mu)
        m_new -= d
        new = np.multiply(m_new, mu)
        new -= d
        new *= np.float32(self.lr)
        np.subtract(p, new, out=new)
        return new.reshape(shape), {"m": m_new.reshape(shape)}


_OPTIMIZERS: dict[str, Callable[..., ServerOptimizer]] = {
    "fedavg": FedAvg,
    "fedavgm": FedAvgM,
    "fedadam": FedAdam,
    "diloco": DiLoCo,
}


def make_server_optimizer(name: str, **params: Any) -> ServerOptimizer:
    """Build an optimizer from a job spec's strategy name and parameters.

    Unknown parameters raise rather than being ignored: a typo in a job spec
    (``momemtum=0.5``) would otherwise train silently with the default.
    """
    factory = _OPTIMIZERS.get(str(name).lower())
    if factory is None:
        raise AggregationError(
            f"unknown server optimizer {name!r}; valid names: {', '.join(_OPTIMIZERS)}"
        )
    try:
        return factory(**params)
    except TypeError as exc:
        raise AggregationError(f"bad parameters for server optimizer {name!r}: {exc}") from None
