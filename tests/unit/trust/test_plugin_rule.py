from __future__ import annotations

import numpy as np
import pytest

from gpuflex.jobspec import JobSpec
from gpuflex.node.core.pipeline import make_reducer
from gpuflex.plugins import PluginError


def spec(rule: str, **params: float) -> JobSpec:
    return JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "rule": rule,
                              "rule_params": params})


def test_a_rule_plugin_combines_updates_at_a_leader() -> None:
    reducer = make_reducer(spec("tests.unit.trust.plugin_rules:scaled_first", factor=2.0), is_root=True)
    reducer.add(np.array([1.0, 2.0], dtype=np.float32), 10, "a")
    reducer.add(np.array([5.0, 5.0], dtype=np.float32), 10, "b")
    assert np.allclose(reducer.result(), [2.0, 4.0])


def test_a_broken_rule_path_names_what_was_expected() -> None:
    with pytest.raises(PluginError, match="rule"):
        make_reducer(spec("tests.unit.trust.no_such_module:rule"), is_root=True)
