"""The node's facade: deterministic start, training that learns, loadable results."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gpuflex.jobspec import JobSpec
from gpuflex.ml.workload import Workload
from gpuflex.nodeconfig import NodeConfig, with_flags
from gpuflex.plugins import PluginError

FIXTURES = "tests.unit.ml.plugin_fixtures"


def test_initial_params_identical_across_instances(digits_spec: JobSpec):
    rng_before = torch.random.get_rng_state()
    a, b = Workload(digits_spec, 0, 4), Workload(digits_spec, 3, 4)
    assert np.array_equal(a.initial_params(), b.initial_params())
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # forked RNG, caller untouched
    assert a.num_params == a.initial_params().shape[0]
    assert a.num_samples + b.num_samples < 1348


def test_train_reduces_loss_and_reports_metrics(digits_spec: JobSpec):
    # IID, so that one node's progress shows on the shared test split; under label skew a
    # single node's update can make the global test loss worse, which is the point of FedAvg.
    digits_spec = dataclasses.replace(digits_spec, partition="iid")
    work = Workload(digits_spec, 0, 2)
    params = work.initial_params()
    before = work.evaluate(params)
    delta, metrics = work.train(params)
    assert delta.dtype == np.float32 and delta.shape == params.shape
    after = work.evaluate(params + delta)
    assert after["loss"] < before["loss"]
    assert {"train_loss", "samples", "steps", "seconds"} <= set(metrics)
    assert metrics["samples"] == digits_spec.local_epochs * work.num_samples


def test_local_steps_wins(digits_spec: JobSpec):
    spec = JobSpec.from_dict({**digits_spec.to_dict(), "local_steps": 50})
    _, metrics = Workload(spec, 0, 4).train(Workload(spec, 0, 4).initial_params())
    assert metrics["steps"] == 50


def test_state_dict_loads_with_plain_torch_load(digits_spec: JobSpec, tmp_path: Path):
    work = Workload(digits_spec, 0, 4)
    params = work.initial_params() + 0.5
    path = work.save_state_dict(params, tmp_path / "out" / "model.pt")
    state = torch.load(path)
    from gpuflex.ml.models import DigitsCNN

    model = DigitsCNN()
    model.load_state_dict(state)
    flat = torch.cat([v.reshape(-1) for v in model.state_dict().values()]).numpy()
    assert np.array_equal(flat, params)


def test_usable_from_worker_threads(digits_spec: JobSpec):
    work = Workload(digits_spec, 1, 4)
    base = work.initial_params()
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(work.train(base)[0])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and all(np.isfinite(r).all() for r in results)


def test_plugins_for_model_data_train_fn_and_partitioner():
    spec = JobSpec(
        model=f"{FIXTURES}:tiny_model",
        data=f"{FIXTURES}:blobs",
        train_fn=f"{FIXTURES}:counting_train",
        partitioner=f"{FIXTURES}:halves",
        lr=0.25,
    )
    work = Workload(spec, 1, 2)
    assert work.num_samples == 90 and work.num_params == 5 * 3 + 3
    delta, metrics = work.train(work.initial_params())
    assert np.allclose(delta, 1.0)
    assert metrics["samples"] == 90 and metrics["custom"] == 0.25
    accuracy = work.evaluate(work.initial_params())["accuracy"]
    assert 0.0 <= accuracy <= 1.0


def test_plugin_of_the_wrong_shape_is_a_clear_error():
    with pytest.raises(PluginError, match=r"returned str, expected a torch\.nn\.Module"):
        Workload(JobSpec(model=f"{FIXTURES}:not_a_model", data="sklearn-digits"), 0, 2)
    bad = JobSpec(model="digits-cnn", data="sklearn-digits", train_fn=f"{FIXTURES}:bad_train")
    work = Workload(bad, 0, 2)
    with pytest.raises(PluginError, match="returned float, expected a dict"):
        work.train(work.initial_params())


def local_data(**entries: Path) -> NodeConfig:
    """A node's own data locations, as node.toml [data] or --data give them."""
    return with_flags(NodeConfig(), data=[f"{name}={path}" for name, path in entries.items()])


def test_other_builtin_models_train(cifar_dir: Path, play_file: Path):
    config = local_data(cifar10=cifar_dir, shakespeare=play_file)
    for spec in (
        JobSpec(model="cifar10-cnn", data="cifar10", batch_size=8),
        JobSpec(model="char-gru", data="shakespeare", batch_size=4),
        JobSpec(model="mlp", data="sklearn-breast-cancer", partition="shards"),
    ):
        work = Workload(spec, 0, 2, config=config)
        delta, metrics = work.train(work.initial_params())
        assert np.isfinite(delta).all() and np.abs(delta).sum() > 0, spec.model
        assert np.isfinite(metrics["train_loss"])


def test_groups_partition_on_shakespeare(play_file: Path):
    spec = JobSpec(model="char-gru", data="shakespeare", partition="groups")
    parts = [Workload(spec, i, 2, config=local_data(shakespeare=play_file)) for i in range(2)]
    groups = parts[0].bundle.groups
    roles = [set(groups[w.indices]) for w in parts]
    assert roles[0] and roles[1] and not roles[0] & roles[1]


def test_local_partition_reads_the_data_its_node_toml_names(tmp_path: Path, play_file: Path):
    home = tmp_path / "node-a"
    (home / "data").mkdir(parents=True)
    (home / "data" / "mine.txt").write_text(play_file.read_text())
    (home / "node.toml").write_text('[data]\nshakespeare = "data/mine.txt"\n')  # relative: inside the home
    spec = JobSpec(model="char-gru", data="shakespeare", partition="local")
    work = Workload(spec, 0, 3, home=home)
    assert work.num_samples == len(work.bundle.train)
