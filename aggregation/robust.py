"""Byzantine-robust aggregation rules and the factory the node uses to pick one.

Robust rules count every peer once and take ``weights`` only so that all
rules share one call signature: sample counts are self-reported, and a rule
that let a peer claim a billion samples would give that peer the control the
rule exists to deny it. The exception is multi-Krum, which uses weights to
average the survivors only after selection, as Flower does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aggregation._checks import as_weights, check_int
from aggregation.clipping import centered_clipping, check_tau, norm_bound
from aggregation.coordinate import check_beta, coordinate_median, trimmed_mean
from aggregation.errors import AggregationError
from aggregation.krum import check_f, krum, krum_select, multi_krum
from aggregation.weighted import weighted_mean

__all__ = [
    "Rule",
    "centered_clipping",
    "coordinate_median",
    "krum",
    "krum_select",
    "make_rule",
    "multi_krum",
    "norm_bound",
    "trimmed_mean",
]

Rule = Callable[[Sequence[np.ndarray], Sequence[float] | None], np.ndarray]


def weighted_mean_or_equal(
    vectors: Sequence[np.ndarray], weights: Sequence[float] | None = None
) -> np.ndarray:
    """Weighted mean that treats missing weights as equal, for the "mean" rule."""
    return weighted_mean(vectors, as_weights(weights, len(vectors)).tolist())


#: Centered clipping's inner loop runs this many times at most: a job names the count, and a
#: leader pays for it over every vector of its group.
MAX_CLIPPING_ITERATIONS = 100


def _check_none() -> None:
    return None


def _check_trimmed(beta: float) -> None:
    check_beta(beta)


def _check_krum(f: int) -> None:
    check_f(f)


def _check_multi_krum(f: int, m: int | None = None) -> None:
    check_f(f)
    if m is not None:
        check_int(m, "m", low=1)


def _check_clipping(tau: float, iterations: int = 3) -> None:
    check_tau(tau)
    if check_int(iterations, "iterations", low=1) > MAX_CLIPPING_ITERATIONS:
        raise AggregationError(f"iterations must be at most {MAX_CLIPPING_ITERATIONS}, got {iterations}")


@dataclass(frozen=True)
class _RuleSpec:
    """A rule function and the check of its hyper-parameters.

    The check's signature is the list of parameters a job spec may set, so
    an unknown or missing one is a TypeError from the check, raised when the
    rule is made rather than in the middle of a round.
    """

    function: Callable[..., np.ndarray]
    check: Callable[..., None]


_RULES: dict[str, _RuleSpec] = {
    "mean": _RuleSpec(weighted_mean_or_equal, _check_none),
    "median": _RuleSpec(coordinate_median, _check_none),
    "trimmed-mean": _RuleSpec(trimmed_mean, _check_trimmed),
    "krum": _RuleSpec(krum, _check_krum),
    "multi-krum": _RuleSpec(multi_krum, _check_multi_krum),
    "centered-clipping": _RuleSpec(centered_clipping, _check_clipping),
}


def make_rule(name: str, **params: Any) -> Rule:
    """Return ``rule(vectors, weights=None)`` for a job spec's rule name.

    Parameters are checked here, when the job starts, so a bad spec fails
    once and loudly instead of at every leader in every round.
    """
    spec = _RULES.get(str(name).lower())
    if spec is None:
        raise AggregationError(f"unknown rule {name!r}; valid names: {', '.join(_RULES)}")
    try:
        spec.check(**params)
    except TypeError:
        accepted = ", ".join(inspect.signature(spec.check).parameters) or "none"
        raise AggregationError(
            f"bad parameters for rule {name!r}: got {sorted(params)}, accepted: {accepted}"
        ) from None

    def rule(vectors: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray:
        return spec.function(vectors, weights=weights, **params)

    rule.__name__ = f"rule_{name}"
    return rule
