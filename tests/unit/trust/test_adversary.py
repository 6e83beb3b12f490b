"""The attack harness: each kind does what the issue says, seeing only its own delta."""

from __future__ import annotations

import numpy as np
import pytest

from gpuflex.adversary import KINDS, flip_labels, loopback_only, make_adversary


def test_delta_attacks() -> None:
    delta = np.array([0.1, -0.2, 0.3, -0.4], dtype=np.float32)
    assert make_adversary("sign-flip").tamper(delta) == pytest.approx(-4 * delta)
    assert make_adversary("scale").tamper(delta) == pytest.approx(100 * delta)
    noise = make_adversary("gaussian").tamper(np.ones(10000, dtype=np.float32) * 0.01 + np.arange(10000) * 1e-6)
    assert abs(float(noise.mean())) < 0.01
    lie = make_adversary("little-is-enough").tamper(delta)
    assert np.all(np.sign(lie - delta) == -np.sign(delta))  # every coordinate pushed the wrong way ...
    assert np.linalg.norm(lie) < 2 * np.linalg.norm(delta)  # ... while staying near honest size
    flip = make_adversary("label-flip")
    assert flip.tamper(delta) is not None and np.array_equal(flip.tamper(delta), delta)
    assert flip.data_hook() is flip_labels and make_adversary("scale").data_hook() is None
    assert set(KINDS) == {"sign-flip", "scale", "gaussian", "little-is-enough", "label-flip"}
    with pytest.raises(ValueError, match="unknown adversary"):
        make_adversary("nice")


def test_label_flip_view_and_loopback() -> None:
    data = [(np.zeros(2), y) for y in (0, 3, 9)]
    flipped = flip_labels(data, 10)
    assert [flipped[i][1] for i in range(len(flipped))] == [9, 6, 0]
    assert loopback_only(["/ip4/127.0.0.1/tcp/0"]) and not loopback_only(["/ip4/0.0.0.0/tcp/0"])
