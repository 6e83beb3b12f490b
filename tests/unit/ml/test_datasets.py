"""Built-in data: shapes, a split every node agrees on, and loaders for files on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gpuflex.jobspec import JobSpec
from gpuflex.ml.datasets import VOCAB, DataError, load_data, split_roles
from gpuflex.plugins import PluginError

from .conftest import shared_data_dir

FIXTURES = "tests.unit.ml.plugin_fixtures"


def test_digits_split_is_deterministic_and_stratified():
    spec = JobSpec(model="digits-cnn", data="sklearn-digits", seed=3)
    a, b = load_data(spec), load_data(spec)
    assert a.input_shape == (1, 8, 8) and a.num_classes == 10
    assert len(a.train) + len(a.test) == 1797
    assert torch.equal(a.test.tensors[0], b.test.tensors[0])
    assert len(np.unique(a.test.tensors[1].numpy())) == 10


def test_breast_cancer_is_standardised():
    bundle = load_data(JobSpec(model="mlp", data="sklearn-breast-cancer"))
    x = bundle.train.tensors[0].numpy()
    assert bundle.input_shape == (30,) and bundle.num_classes == 2
    assert np.allclose(x.mean(axis=0), 0, atol=1e-4) and np.allclose(x.std(axis=0), 1, atol=1e-3)


def test_cifar10_reads_python_batches(cifar_dir: Path):
    spec = JobSpec(model="cifar10-cnn", data="cifar10")
    bundle = load_data(spec, str(cifar_dir))
    assert len(bundle.train) == 60 and len(bundle.test) == 12
    x, y = bundle.train[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and 0 <= int(y) < 10
    assert bundle.input_shape == (3, 32, 32) and bundle.num_classes == 10


def test_cifar10_wrong_folder_is_a_clear_error(tmp_path: Path):
    spec = JobSpec(model="cifar10-cnn", data="cifar10")
    with pytest.raises(DataError, match="is not on this node"):
        load_data(spec)
    with pytest.raises(DataError, match=r"expected data_batch_1\.\.5 and test_batch"):
        load_data(spec, str(tmp_path))
    (tmp_path / "data_batch_1").write_bytes(b"not a pickle")
    (tmp_path / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="not a CIFAR-10 python batch"):
        load_data(spec, str(tmp_path))


def test_shakespeare_splits_by_role(play_file: Path):
    assert sorted(split_roles(play_file.read_text())) == ["All", "First Citizen", "Second Citizen"]
    spec = JobSpec(model="char-gru", data="shakespeare")
    bundle = load_data(spec, str(play_file))
    x, _ = bundle.train[0]
    assert x.shape == (80,) and x.dtype == torch.long
    assert bundle.num_classes == len(VOCAB) and bundle.groups is not None
    assert len(bundle.groups) == len(bundle.train)
    assert list(bundle.group_names) == ["All", "First Citizen", "Second Citizen"]


def test_shakespeare_real_file_when_present():
    path = shared_data_dir() / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    spec = JobSpec(model="char-gru", data="shakespeare", partition="groups")
    bundle = load_data(spec, str(path))
    assert len(bundle.group_names) > 100  # LEAF-style: many roles, each a natural client
    assert len(bundle.train) > 5000
    assert bundle.groups is not None and len(np.unique(bundle.groups)) > 100


def test_data_plugin_tuple_and_errors():
    bundle = load_data(JobSpec(model="mlp", data=f"{FIXTURES}:blobs"))
    assert bundle.num_classes == 3 and bundle.input_shape == (5,) and len(bundle.train) == 180
    with pytest.raises(PluginError, match=r"expected \(train_dataset, test_dataset\)"):
        load_data(JobSpec(model="mlp", data=f"{FIXTURES}:not_datasets"))
    with pytest.raises(PluginError, match="no module named 'nowhere'"):
        load_data(JobSpec(model="mlp", data="nowhere.data:load"))
