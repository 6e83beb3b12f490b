"""Every error class gpuflex defines has one root, ``GpuflexError``, so a caller tells the
product's own failures from bugs with one ``except`` instead of a list of unrelated bases.

The test imports every module of the package and checks each exception class defined there;
a new error class outside the root fails it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import gpuflex
from gpuflex.errors import GpuflexError


def gpuflex_modules() -> list[str]:
    names = [gpuflex.__name__]
    for info in pkgutil.walk_packages(gpuflex.__path__, prefix="gpuflex."):
        if info.name.rsplit(".", 1)[-1] != "__main__":  # running it starts the CLI
            names.append(info.name)
    return names


def test_every_gpuflex_error_class_is_under_gpuflex_error() -> None:
    outside, seen = [], 0
    for name in gpuflex_modules():
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            seen += 1
            if not issubclass(cls, GpuflexError):
                outside.append(f"{name}.{cls_name}")
    assert seen > 20  # the walk found the package's error classes at all
    assert outside == []
