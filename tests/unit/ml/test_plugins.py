"""Plug-in paths: a bad one names what was expected, never a traceback."""

from __future__ import annotations

import pytest

from gpuflex.plugins import PluginError, call_with_accepted, load_callable

FIXTURES = "tests.unit.ml.plugin_fixtures"


def test_loads_a_function():
    assert load_callable(f"{FIXTURES}:tiny_model", "model").__name__ == "tiny_model"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("foo.bar:make", "no module named 'foo'"),
        ("nocolon", "not of the form"),
        (f"{FIXTURES}:missing", "has no attribute 'missing'"),
        (f"{FIXTURES}:NOT_CALLABLE", "is a int, not a function"),
        # What the module imported is no plug-in of it: not a module's function, nor one it imports.
        (f"{FIXTURES}:np.abs", "goes through module 'numpy'"),
        (f"{FIXTURES}:torch.save", "goes through module 'torch'"),
        (f"{FIXTURES}:TensorDataset", "is defined in 'torch.utils.data.dataset', not in"),
        (f"{FIXTURES}:tiny_model.__globals__", "Python's internals"),
    ],
)
def test_bad_paths_explain_what_was_expected(path: str, reason: str):
    with pytest.raises(PluginError) as info:
        load_callable(path, "model")
    message = str(info.value)
    assert message.startswith(f"model {path!r} could not be loaded: ")
    assert reason in message
    assert "(expected 'package.module:function' returning torch.nn.Module)" in message


def test_missing_module_message_is_exact():
    with pytest.raises(PluginError) as info:
        load_callable("foo.bar:make", "model")
    assert str(info.value) == (
        "model 'foo.bar:make' could not be loaded: no module named 'foo' "
        "(expected 'package.module:function' returning torch.nn.Module)"
    )


def test_call_with_accepted_passes_only_named_arguments():
    assert call_with_accepted(lambda: 1, "model", num_classes=3) == 1
    assert call_with_accepted(lambda num_classes: num_classes, "model", num_classes=3) == 3
    with pytest.raises(PluginError, match="needs argument 'flavour'"):
        call_with_accepted(load_callable(f"{FIXTURES}:needs_unknown_argument", "model"), "model")
