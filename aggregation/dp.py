"""Client-side differential-privacy helpers: clip, then add Gaussian noise.

This is the Gaussian mechanism of DP-SGD/DP-FedAvg applied to a whole
update: clipping bounds each client's sensitivity to ``max_norm``, so noise
of std ``noise_multiplier * max_norm`` gives a privacy guarantee that does
not depend on the data. Accounting (epsilon over rounds) is the caller's job.
"""

from __future__ import annotations

import numpy as np

from aggregation._checks import as_vector, check_number, l2_norm
from aggregation.errors import AggregationError


def clip_to_norm(vec: np.ndarray, max_norm: float) -> tuple[np.ndarray, float]:
    """Scale ``vec`` down to L2 norm ``max_norm`` if longer; return (copy, scale).

    The scale (1.0 when nothing was clipped) is returned because how often
    clients clip is the signal for tuning ``max_norm``.
    """
    max_norm = check_number(max_norm, "max_norm", low=0.0, low_open=True)
    flat = as_vector(vec, "vector")
    norm = l2_norm(flat)
    scale = 1.0 if norm <= max_norm else max_norm / norm
    return (flat * np.float32(scale)).reshape(np.shape(vec)), scale


def add_gaussian_noise(
    vec: np.ndarray, noise_multiplier: float, max_norm: float, rng: np.random.Generator
) -> np.ndarray:
    """Return ``vec`` plus N(0, (noise_multiplier * max_norm)^2) per coordinate.

    The generator is explicit so tests are reproducible and so no caller
    draws noise from a shared global state by accident.
    """
    multiplier = check_number(noise_multiplier, "noise_multiplier", low=0.0)
    max_norm = check_number(max_norm, "max_norm", low=0.0, low_open=True)
    if not isinstance(rng, np.random.Generator):
        raise AggregationError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    flat = as_vector(vec, "vector")
    noise = rng.standard_normal(flat.size, dtype=np.float32)
    noise *= np.float32(multiplier * max_norm)
    noise += flat
    return noise.reshape(np.shape(vec))
