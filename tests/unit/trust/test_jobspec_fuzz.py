"""The job-spec validator under hostile values: a spec from the wire is a stranger's.

Whatever a field holds (a path, an import path, a huge number or string, a nested structure,
the msgpack types a frame decodes to), ``JobSpec.from_dict`` either raises JobSpecError with
short messages, or returns a spec whose every number and string is within its bound, that
names no path, that fits in a job frame, and that survives its own round trip. It imports,
opens and calls nothing on the way.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aggregation.robust  # noqa: F401 - imported by validation of robust rules; loaded before counting modules
from gpuflex import jobspec
from gpuflex.jobspec import BUILTIN_DATA, BUILTIN_MODELS, JobSpec, JobSpecError
from gpuflex.plugins import MAX_PATH_CHARS, is_plugin_path, plugin_path_problem

FIELDS = [f.name for f in fields(JobSpec)]
BASE = {"model": "digits-cnn", "data": "sklearn-digits", "rounds": 2}
JOB_FRAME_LIMIT = 256 * 1024  # gpuflex.node.core.messages: register_kind(JOB, ...)
INT_BOUNDS = {
    "rounds": jobspec.MAX_ROUNDS, "local_epochs": jobspec.MAX_LOCAL_EPOCHS, "local_steps": jobspec.MAX_LOCAL_STEPS,
    "batch_size": jobspec.MAX_BATCH_SIZE, "group_size": jobspec.MAX_GROUP_SIZE, "min_nodes": jobspec.MAX_MEMBERS,
    "shards_per_node": jobspec.MAX_SHARDS, "secagg_threshold": jobspec.MAX_GROUP_SIZE, "seed": 2**63 - 1,
}


def deep(levels: int) -> list[Any]:
    out: list[Any] = []
    inner = out
    for _ in range(levels):
        inner.append([])
        inner = inner[0]
    return out


PATHS = st.sampled_from(["/dev/zero", "/etc/passwd", "../../.ssh/id_ed25519", "~/.gpuflex/identity.key",
                         "data/../../x", "C:\\Windows\\win.ini", "file:///dev/zero", "\x00", "/proc/self/mem"])
IMPORT_PATHS = st.sampled_from(["os:abort", "os:system", "subprocess:run", "builtins:eval", "builtins:__import__",
                                "torch.nn:Transformer", "pickle:loads", "gpuflex.sdk:LOCAL.model_1",
                                "importlib:import_module", "os.path:join", "a" * 300 + ":f", "x:" + "y." * 200,
                                "__main__:main", "os:abort:now", ":", "os:", ":abort"])
NUMBERS = st.sampled_from([2**63, -(2**63), 2**64 - 1, 10**100, -1, 0, 1e308, float("inf"), float("-inf"),
                           float("nan"), -0.0, True, False]) | st.integers() | st.floats()
STRINGS = st.sampled_from(["x" * 1_000_000, "[/evil]", "\x1b[2J\r", "$\\x$", "", " ", "mean", "median",
                           "krum", "shakespeare", "cifar10", "llama", "\u202eevil"]) | st.text(max_size=300)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | st.binary(max_size=12)
NESTED = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=10) | st.integers() | st.binary(max_size=4), inner,
                                        max_size=5), max_leaves=30)
BIG = st.sampled_from([deep(3000), list(range(200_000)), {str(i): i for i in range(20_000)}, ["peer"] * 5000,
                       {"config": {"hidden_size": 10**12}}, {"size": "base", "config": {"num_hidden_layers": 96,
                                                                                         "hidden_size": 8192}}])
HOSTILE = st.one_of(PATHS, IMPORT_PATHS, NUMBERS, STRINGS, NESTED, BIG)
OVERRIDES = st.dictionaries(st.sampled_from([*FIELDS, "unknown", "__class__", "data_path"]), HOSTILE, max_size=6)
MODELS = st.sampled_from([*BUILTIN_MODELS, "os:abort"])
DATA = st.sampled_from([*BUILTIN_DATA, "pickle:loads"])


def check_accepted(spec: JobSpec) -> None:
    assert spec.data_path == ""  # no path ever reaches a node
    for name, bound in INT_BOUNDS.items():
        assert 0 <= getattr(spec, name) <= bound, name
    assert 0 < len(spec.name) <= jobspec.MAX_NAME_CHARS
    assert all(0 < len(p) <= 128 for p in spec.allowlist) and len(spec.allowlist) <= jobspec.MAX_ALLOWLIST
    for name in ("plan_timeout_s", "train_timeout_s", "reduce_timeout_s"):
        assert 0 <= getattr(spec, name) <= jobspec.MAX_TIMEOUT_S
    for name in ("model", "data", "train_fn", "partitioner", "rule"):
        value = getattr(spec, name)
        if value and is_plugin_path(value):
            assert plugin_path_problem(value) is None and len(value) <= MAX_PATH_CHARS
    assert spec.model in BUILTIN_MODELS or is_plugin_path(spec.model)
    assert spec.data in BUILTIN_DATA or is_plugin_path(spec.data)
    data = spec.to_dict()
    assert len(msgpack.packb(data)) < JOB_FRAME_LIMIT  # an accepted spec fits in a job frame
    assert JobSpec.from_dict(msgpack.unpackb(msgpack.packb(data))) == spec  # as a peer decodes it
    assert JobSpec.from_dict(json.loads(spec.canonical_bytes())).canonical_bytes() == spec.canonical_bytes()


def validate(raw: dict[str, Any]) -> None:
    modules = set(sys.modules)
    try:
        spec = JobSpec.from_dict(raw)
    except JobSpecError as exc:
        assert exc.errors and all(len(m) <= jobspec.MAX_MESSAGE_CHARS and len(f) <= 80 for f, m in exc.errors)
        assert len(exc.errors) <= len(FIELDS) + jobspec.MAX_UNKNOWN_LISTED + 1
    else:
        check_accepted(spec)
    assert set(sys.modules) == modules, set(sys.modules) - modules  # nothing named was imported


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=MODELS, data=DATA, overrides=OVERRIDES)
def test_hostile_values_are_refused_or_bounded(model: str, data: str, overrides: dict[str, Any]) -> None:
    validate({**BASE, "model": model, "data": data, **overrides})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["llama", "gpt2", "pretrained"]), llm=st.dictionaries(
    st.sampled_from(["size", "config", "pretrained", "corpus", "tokenizer", "seq_len", "lora_targets",
                     "vocab_size", "base_hash", "x", "__class__"]), HOSTILE, max_size=5) | HOSTILE)
def test_hostile_language_model_tables_are_refused_or_bounded(model: str, llm: Any) -> None:
    validate({"model": model, "data": "shakespeare", "partition": "groups", "llm": llm})


def test_every_field_survives_the_worst_cases() -> None:
    """The values hypothesis might not draw, in every field, one at a time."""
    worst = [deep(3000), "x" * 1_000_000, 10**100, -(2**63), float("nan"), {"a": {"b": {"c": {"d": {}}}}},
             b"\xff" * 100, [b"x"], {1: 2, "a": 3}, "/dev/zero", "os:abort", None]
    for field in [*FIELDS, "unknown"]:
        for value in worst:
            validate({**BASE, field: value})
    validate({f"key{i}": i for i in range(5000)})  # thousands of unknown keys, listed in brief
