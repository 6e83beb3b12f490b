"""How the SDK turns Python callables into plug-in references, and the errors users see."""

from __future__ import annotations

import pytest

from gpuflex import sdk
from gpuflex.plugins import PluginError, load_callable
from tests.unit.workflow import sdk_fixtures as fx


def test_module_level_function_becomes_its_import_path() -> None:
    assert sdk.importable_path(fx.make_model, "model") == "tests.unit.workflow.sdk_fixtures:make_model"


def test_lambda_local_and_main_functions_are_refused_with_the_fix() -> None:
    def local_model() -> None: ...

    with pytest.raises(PluginError, match=r"is a lambda.*run_local"):
        sdk.importable_path(lambda: None, "model")
    with pytest.raises(PluginError, match="inside another function"):
        sdk.importable_path(local_model, "model")
    local_model.__qualname__ = "local_model"
    local_model.__module__ = "__main__"
    with pytest.raises(PluginError, match="__main__"):
        sdk.importable_path(local_model, "model")


def test_broken_plugin_path_fails_before_any_node_is_involved(tmp_path) -> None:
    with pytest.raises(PluginError) as err:
        sdk.submit("no_such_pkg.models:make", fx.make_data, home=tmp_path, rounds=1)
    text = str(err.value)
    assert "no module named 'no_such_pkg'" in text and "returning torch.nn.Module" in text
    with pytest.raises(PluginError, match="has no attribute 'missing'"):
        sdk.run_local(fx.make_model, "tests.unit.workflow.sdk_fixtures:missing", rounds=1)
    with pytest.raises(PluginError, match="must be a function"):
        sdk.build_spec(fx.make_model, 42, in_process=True)  # type: ignore[arg-type]


def test_submit_refuses_a_lambda_with_a_clear_error(tmp_path) -> None:
    with pytest.raises(PluginError, match="lambda"):
        sdk.submit(lambda num_classes: None, fx.make_data, home=tmp_path)


def test_in_process_callables_go_through_the_local_registry() -> None:
    def model(num_classes: int, input_shape: tuple[int, ...]) -> object:
        return fx.make_model(num_classes, input_shape)

    spec = sdk.build_spec(model, fx.make_data, in_process=True, train_fn=fx.sgd_loop, rounds=2, local_steps=3)
    assert spec["model"].startswith("gpuflex.sdk:LOCAL.model_")
    assert load_callable(spec["model"], "model") is model
    assert load_callable(spec["train_fn"], "train_fn") is fx.sgd_loop
    assert spec["rounds"] == 2 and spec["local_steps"] == 3


def test_bad_settings_are_all_reported() -> None:
    from gpuflex.jobspec import JobSpecError

    with pytest.raises(JobSpecError) as err:
        sdk.build_spec("mlp", "sklearn-digits", in_process=False, rounds=0, lrr=0.1)
    assert {name for name, _ in err.value.errors} >= {"rounds", "lrr"}
