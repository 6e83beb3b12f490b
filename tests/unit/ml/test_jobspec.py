"""Job files: every mistake reported by field, and a canonical form that round-trips."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgpack
import pytest

from gpuflex.jobspec import JobSpec, JobSpecError, example_job_toml

MINIMAL = {"model": "digits-cnn", "data": "sklearn-digits"}


def errors_of(data: dict, **kwargs) -> dict[str, str]:
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(data, **kwargs)
    return dict(info.value.errors)


def test_minimal_job_gets_defaults():
    spec = JobSpec.from_dict(MINIMAL)
    assert spec.name == "job" and spec.rounds == 15 and spec.group_size == 4
    assert spec.allowlist == () and not spec.uses_steps


def test_missing_required_fields():
    errors = errors_of({})
    assert set(errors) == {"model", "data"}
    assert "is required" in errors["model"]


def test_every_error_is_listed_by_field():
    bad = {
        "model": "resnet",
        "data": "sklearn-digits",
        "rounds": "ten",
        "lrr": 0.1,
        "alpha": -1,
        "batch_size": 0,
        "optimizer": "lion",
        "group_size": 1,
        "test_fraction": 1.5,
        "allowlist": "peer",
        "train_fn": "no_colon",
        "shards_per_node": True,
    }
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(bad)
    errors = dict(info.value.errors)
    assert set(errors) == {
        "model", "rounds", "lrr", "alpha", "batch_size", "optimizer", "group_size",
        "test_fraction", "allowlist", "train_fn", "shards_per_node",
    }
    assert errors["rounds"] == "must be an integer from 1 to 100000, got 'ten'"
    assert "did you mean 'lr'" in errors["lrr"]
    assert "unknown built-in model 'resnet'" in errors["model"]
    assert "'lion'" in errors["optimizer"] and "'adamw'" in errors["optimizer"]
    text = str(info.value)
    assert "rounds: must be an integer from 1 to 100000, got 'ten'" in text.splitlines()
    assert len(text.splitlines()) == len(errors)


def test_unknown_data_suggests_the_close_name():
    errors = errors_of({"model": "mlp", "data": "sklearn-digit"})
    assert "did you mean 'sklearn-digits'" in errors["data"]


def test_a_job_never_carries_a_path(tmp_path: Path):
    # A data set is named; each node's operator says where it lives (node.toml [data]).
    assert JobSpec.from_dict({"model": "cifar10-cnn", "data": "cifar10"}).data_path == ""
    for path in ("/dev/zero", str(tmp_path), "data/mine.txt", "../../etc/passwd"):
        errors = errors_of({"model": "char-gru", "data": "shakespeare", "data_path": path})
        assert "cannot carry a path" in errors["data_path"] and "--data NAME=PATH" in errors["data_path"]


def test_epochs_and_steps_cannot_both_be_zero():
    errors = errors_of({**MINIMAL, "local_epochs": 0})
    assert "local_steps" in errors["local_epochs"]
    spec = JobSpec.from_dict({**MINIMAL, "local_steps": 5})
    assert spec.uses_steps


def test_groups_partition_needs_grouped_data():
    errors = errors_of({**MINIMAL, "partition": "groups"})
    assert "natural groups" in errors["partition"]


def test_plugin_paths_are_checked_for_syntax_only():
    spec = JobSpec.from_dict({"model": "not_installed.mod:make", "data": "sklearn-digits"})
    assert spec.model == "not_installed.mod:make"
    errors = errors_of({"model": "a.b:c:d", "data": "sklearn-digits"})
    assert "package.module:function" in errors["model"]


def test_round_trip_and_canonical_bytes():
    spec = JobSpec.from_dict({**MINIMAL, "allowlist": ["peer-a", "peer-b"], "lr": 1, "seed": 3})
    data = spec.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert msgpack.unpackb(msgpack.packb(data)) == data
    again = JobSpec.from_dict(data)
    assert again == spec
    assert again.canonical_bytes() == spec.canonical_bytes()
    assert isinstance(spec.lr, float)  # an int in the file must not change the bytes


def test_template_parses_and_validates(tmp_path: Path):
    path = tmp_path / "job.toml"
    path.write_text(example_job_toml(), encoding="utf-8")
    spec = JobSpec.from_toml(path)
    assert (spec.model, spec.data, spec.partition, spec.alpha, spec.rounds) == (
        "digits-cnn", "sklearn-digits", "dirichlet", 0.5, 15,
    )
    # The template documents the defaults: every tuned value matches the dataclass.
    defaults = JobSpec(model="digits-cnn", data="sklearn-digits")
    for key in ("local_epochs", "batch_size", "lr", "optimizer", "server_lr", "test_fraction"):
        assert getattr(spec, key) == getattr(defaults, key), key


def test_toml_file_problems_are_field_errors(tmp_path: Path):
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_toml(tmp_path / "missing.toml")
    assert info.value.errors[0][0] == "file"
    broken = tmp_path / "broken.toml"
    broken.write_text("model = \n", encoding="utf-8")
    with pytest.raises(JobSpecError, match="not valid TOML"):
        JobSpec.from_toml(broken)


def test_jobspec_does_not_import_torch():
    import subprocess

    code = "import sys, gpuflex.jobspec, gpuflex.plugins; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_default_strategy_is_server_momentum_and_diloco_keeps_its_own_momentum() -> None:
    plain = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits"})
    assert (plain.strategy, plain.server_lr, plain.server_momentum) == ("fedavgm", 1.0, 0.7)
    for strategy in ("diloco", "fedadam"):
        spec = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "strategy": strategy})
        assert spec.server_momentum == 0.9
        assert JobSpec.from_dict({**spec.to_dict(), "server_momentum": 0.5}).server_momentum == 0.5
    template = JobSpec.from_toml_text(example_job_toml())
    assert (template.strategy, template.server_momentum, template.final_model) == ("fedavgm", 0.7, "best")
