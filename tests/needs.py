"""Skip a test module when an optional package is missing, without importing it.

``pytest.importorskip`` at a module's top imports the package while the module is collected,
in every worker of the suite, though only one of them runs that module: for transformers and
peft that was seconds of CPU per worker. ``find_spec`` only looks the package up; the module
imports it when a test runs."""

from __future__ import annotations

import importlib.util

import pytest

#: Why each optional package is missing, for the skip's reason.
LLM_EXTRA = "the llm extra: pip install 'gpuflex[llm]'"
EXTRAS = {"peft": LLM_EXTRA, "transformers": LLM_EXTRA}


def needs(package: str) -> pytest.MarkDecorator:
    """A skip mark for a module whose tests need ``package``."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"needs {EXTRAS.get(package, package)}")
