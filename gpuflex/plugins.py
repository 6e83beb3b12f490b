"""Plug-ins named by import path: ``package.module:function``.

Users extend GPUFlex with their own models, data sets, partitioners, aggregation rules and
training loops without forking it. The contract is an import path, because a path can travel
inside a signed JobSpec while a Python object cannot. Every failure turns into a
:class:`PluginError` whose message says what was expected, so a typo in a job file reads as a
one-line fix rather than a traceback from deep inside importlib.

This module must stay free of torch: the CLI validates job files with it and has to start fast.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

from gpuflex.errors import GpuflexError

# What each kind of plug-in must look like; quoted in every error so the fix is obvious.
EXPECTED: dict[str, str] = {
    "model": "'package.module:function' returning torch.nn.Module",
    "data": "'package.module:function' returning (train_dataset, test_dataset) or a DataBundle",
    "partitioner": (
        "'package.module:function' taking (labels, num_parts, scheme, *, alpha, "
        "shards_per_node, seed, groups) and returning a list of index arrays"
    ),
    "train_fn": "'package.module:function' taking (model, loader, settings) and returning a dict",
    "rule": "'package.module:function' combining a list of updates",
}

#: The longest plug-in path a spec may carry (a job's fields are bounded, see gpuflex.jobspec).
MAX_PATH_CHARS = 200
_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class PluginError(GpuflexError, ValueError):
    """A plug-in path is malformed, does not import, or names the wrong kind of object."""


def is_plugin_path(text: str) -> bool:
    """Tell a plug-in path from a built-in name: only plug-in paths contain a colon."""
    return ":" in text


def plugin_path_problem(path: str) -> str | None:
    """Check the syntax only, without importing, so validation stays cheap and side-effect free.

    Returns a human-readable problem, or None when the path is well formed.
    """
    if not isinstance(path, str) or not path:
        return "must be a non-empty string"
    if len(path) > MAX_PATH_CHARS:
        return f"is longer than {MAX_PATH_CHARS} characters"
    if path.count(":") != 1:
        return f"{path!r} is not of the form 'package.module:function'"
    if not _PATH_RE.match(path):
        return f"{path!r} is not a valid import path 'package.module:function'"
    return None


def _expected(what: str) -> str:
    return EXPECTED.get(what, "'package.module:function'")


def load_callable(path: str | Callable[..., Any], what: str) -> Callable[..., Any]:
    """Import ``package.module:function`` and return the callable it names.

    A callable passed directly is returned unchanged, so the Python SDK can hand over a
    function object where a job file would hold its path.
    """
    if callable(path):
        return path

    def fail(reason: str) -> PluginError:
        return PluginError(
            f"{what} {path!r} could not be loaded: {reason} (expected {_expected(what)})"
        )

    problem = plugin_path_problem(path)
    if problem is not None:
        raise fail("not of the form 'package.module:function'")
    module_name, attr_path = path.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise fail(f"no module named {exc.name or module_name!r}") from None
    except Exception as exc:  # a user module may raise anything while importing
        raise fail(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    parts = attr_path.split(".")
    if any(part.startswith("__") for part in parts):
        raise fail(f"{attr_path!r} reaches into Python's internals (a name with '__')")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise fail(f"module {module_name!r} has no attribute {attr_path!r}") from None
        if inspect.ismodule(obj):
            raise fail(f"{attr_path!r} goes through module {obj.__name__!r}, which {module_name!r} only imports")
        defined_in = getattr(obj, "__module__", None)
        if i == 0 and (inspect.isclass(obj) or inspect.isroutine(obj)) and defined_in != module_name:
            # A module's namespace also holds what it imported (os.abort, its helpers): a path
            # may name only a function or class the module itself defines (or an attribute of
            # an object it holds, such as the SDK's registry), which is what a pattern allows.
            hint = f"; name it as '{defined_in}:{attr_path}'" if isinstance(defined_in, str) else ""
            raise fail(f"{part!r} is defined in {defined_in!r}, not in {module_name!r}{hint}")
    if not callable(obj):
        raise fail(f"{attr_path!r} is a {type(obj).__name__}, not a function")
    return obj


def call_with_accepted(fn: Callable[..., Any], what: str, **available: Any) -> Any:
    """Call a plug-in with only the keyword arguments its signature names.

    Plug-ins stay as simple as the user likes: ``def make(): ...`` and
    ``def make(num_classes, input_shape): ...`` both work. A required parameter that GPUFlex
    cannot supply is reported rather than left to fail with a bare TypeError.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return fn()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn(**available)
    kwargs: dict[str, Any] = {}
    for p in params:
        if p.name in available and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            kwargs[p.name] = available[p.name]
        elif p.default is p.empty and p.kind not in (p.VAR_POSITIONAL,):
            offered = ", ".join(sorted(available)) or "nothing"
            raise PluginError(
                f"{what} plug-in {getattr(fn, '__qualname__', fn)!r} needs argument {p.name!r}, "
                f"but GPUFlex passes only: {offered} (expected {_expected(what)})"
            )
    return fn(**kwargs)
