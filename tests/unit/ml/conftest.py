"""Shared fixtures: specs for the small built-in data sets and generated files on disk."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from gpuflex.jobspec import JobSpec

REPO_ROOT = Path(__file__).resolve().parents[3]

PLAY = """First Citizen:
Before we proceed any further, hear me speak.
We are accounted poor citizens, the patricians good.

All:
Speak, speak. Resolved, resolved, we know it, we know it.

Second Citizen:
Would you proceed especially against Caius Marcius?
One word, good citizens, I pray you, hear me speak.
"""


def shared_data_dir() -> Path:
    env = os.environ.get("GPUFLEX_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture
def digits_spec() -> JobSpec:
    return JobSpec(model="digits-cnn", data="sklearn-digits", partition="dirichlet", rounds=15)


@pytest.fixture
def cifar_dir(tmp_path: Path) -> Path:
    """A tiny folder in the standard cifar-10-batches-py format."""
    rng = np.random.default_rng(0)
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, size=(12, 3072), dtype=np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, size=12)],
            b"batch_label": name.encode(),
        }
        with (root / name).open("wb") as f:
            pickle.dump(batch, f)
    return root


@pytest.fixture
def play_file(tmp_path: Path) -> Path:
    path = tmp_path / "play.txt"
    path.write_text("\n".join([PLAY] * 6), encoding="utf-8")
    return path
