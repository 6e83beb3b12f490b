"""YAML job files: the same checks, canonical spec and errors as TOML, and a loader that only
builds plain data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.jobspec import TEMPLATES, JobSpec, JobSpecError, example_job_toml, tomllib
from gpuflex.jobyaml import MAX_JOB_FILE_BYTES

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("template", TEMPLATES)
def test_each_template_as_yaml_gives_the_same_canonical_spec(tmp_path: Path, template: str):
    toml_path = tmp_path / "job.toml"
    toml_path.write_text(example_job_toml(template), encoding="utf-8")
    yaml_path = tmp_path / "job.yaml"
    yaml_path.write_text(yaml.safe_dump(tomllib.loads(toml_path.read_text())), encoding="utf-8")
    from_toml, from_yaml = JobSpec.from_file(toml_path), JobSpec.from_file(yaml_path)
    assert from_yaml == from_toml
    assert from_yaml.canonical_bytes() == from_toml.canonical_bytes()


@pytest.mark.parametrize("template", TEMPLATES)
def test_job_init_writes_a_yaml_template_that_validates_like_the_toml(tmp_path: Path, template: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("job.yaml", "job.toml"):
        proc = subprocess.run([sys.executable, "-m", "gpuflex", "job", "init", "--template", template,
                               str(tmp_path / name)], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "job.yaml").read_text(encoding="utf-8")
    assert text.startswith("# The ") and "\nmodel: " in text and " = " not in text  # YAML, not TOML
    yaml_spec, toml_spec = JobSpec.from_file(tmp_path / "job.yaml"), JobSpec.from_file(tmp_path / "job.toml")
    assert yaml_spec.canonical_bytes() == toml_spec.canonical_bytes()


def test_yml_suffix_is_yaml_and_floats_read_as_in_toml(tmp_path: Path):
    path = tmp_path / "job.yml"
    path.write_text("model: digits-cnn\ndata: sklearn-digits\nlr: 1e-3\nrounds: 3\n", encoding="utf-8")
    spec = JobSpec.from_file(path)
    assert (spec.lr, spec.rounds) == (0.001, 3)
    assert spec == JobSpec.from_toml_text('model = "digits-cnn"\ndata = "sklearn-digits"\nlr = 1e-3\nrounds = 3\n')


def test_yaml_lists_every_error_by_field_like_toml(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: nope\ndata: sklearn-digits\nrounds: 0\nlr: -1.0\n", encoding="utf-8")
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_file(path)
    fields = {name for name, _ in info.value.errors}
    assert {"model", "rounds", "lr"} <= fields


@pytest.mark.parametrize(("text", "why"), [
    ("base: &b {model: mlp}\nother: *b\n", "aliases"),
    ("model: !!python/object/apply:os.system ['true']\ndata: x\n", "tag"),
    ("model: mlp\ndata: !!binary aGVsbG8=\n", "tag"),
    ("? [a, b]\n: 1\nmodel: mlp\n", "keys must be strings"),
    ("model: [unclosed\n", "not a valid YAML job"),
])
def test_unsafe_or_broken_yaml_is_a_file_error(text: str, why: str):
    with pytest.raises(JobSpecError, match=why) as info:
        JobSpec.from_yaml_text(text)
    assert info.value.errors[0][0] == "file"


def test_scalars_read_as_in_toml_not_yaml_1_1():
    from gpuflex.jobyaml import load_yaml_job

    data = load_yaml_job("a: 010\nb: 1:30\nc: yes\nd: off\ne: true\nf: 0x10\ng: -12\nh: 1_000\ni: 2.5e3\nj: null\n")
    assert data == {"a": "010", "b": "1:30", "c": "yes", "d": "off", "e": True, "f": 16, "g": -12,
                    "h": 1000, "i": 2500.0, "j": None}
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_yaml_text("model: digits-cnn\ndata: sklearn-digits\nrounds: 010\n")
    assert "rounds" in dict(info.value.errors)


def test_dates_stay_strings_and_are_rejected_by_the_field_check():
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_yaml_text("model: mlp\ndata: sklearn-digits\nname: 2024-01-01\nrounds: 2024-01-01\n")
    errors = dict(info.value.errors)
    assert "rounds" in errors and "name" not in errors


def test_an_oversized_job_file_is_refused_before_parsing(tmp_path: Path):
    path = tmp_path / "big.yaml"
    path.write_text("model: mlp\n" + "#" * (MAX_JOB_FILE_BYTES + 1), encoding="utf-8")
    with pytest.raises(JobSpecError, match="larger than"):
        JobSpec.from_file(path)
    with pytest.raises(JobSpecError, match="larger than"):
        JobSpec.from_yaml_text("#" * (MAX_JOB_FILE_BYTES + 1))


# YAML streams hold printable characters only (control characters are escaped, not written).
printable = st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="\ufffe\uffff")
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.text(printable, max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(printable, max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(printable, max_size=12), values, max_size=8))
def test_any_yaml_mapping_gives_the_same_outcome_as_the_same_dict(data: dict):
    # JSON is YAML: every string stays quoted, every number is written as TOML would read it.
    try:
        expected: JobSpec | str = JobSpec.from_dict(data)
    except JobSpecError as exc:
        expected = str(exc)
    try:
        got: JobSpec | str = JobSpec.from_yaml_text(json.dumps(data, ensure_ascii=False))
    except JobSpecError as exc:
        got = str(exc)
    assert got == expected


def test_job_submit_validates_a_yaml_file_without_a_node(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: nope\ndata: sklearn-digits\nrounds: 0\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUFLEX_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "gpuflex", "job", "submit", str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "is not a valid job" in proc.stderr and "model" in proc.stderr and "rounds" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_doctor_job_reads_yaml_like_toml(tmp_path: Path):
    from gpuflex.doctor import FAIL, OK
    from gpuflex.doctor.fit import check_job_fit

    good = tmp_path / "job.yaml"
    good.write_text("model: digits-cnn\ndata: sklearn-digits\nrounds: 2\n", encoding="utf-8")
    findings = list(check_job_fit(good, home=tmp_path / "home"))
    assert findings and all(f.status == OK for f in findings), findings
    bad = tmp_path / "bad.yml"
    bad.write_text("model: [unclosed\n", encoding="utf-8")
    findings = list(check_job_fit(bad, home=tmp_path / "home"))
    # One headline, then each error on a line of its own, as `job submit` lists them.
    assert findings and all(f.status == FAIL for f in findings)
    assert any("not a valid YAML job" in f.message for f in findings), findings
