"""The layer rule: aggregation imports numpy and the standard library only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import aggregation

_LAYERS = {"torch", "trio", "libp2p", "mesh", "gpuflex", "tui"}
#: numpy itself imports pickle, so pickle is only banned from our own source:
#: deltas from peers must be parsed, never unpickled.
_FORBIDDEN = _LAYERS | {"pickle"}
_PACKAGE = Path(aggregation.__file__).parent


def test_no_forbidden_imports_in_source() -> None:
    for path in sorted(_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in _FORBIDDEN, f"{path.name} imports {name}"


def test_import_pulls_in_nothing_heavy() -> None:
    code = (
        "import sys, aggregation; "
        f"bad = sorted(set({sorted(_LAYERS)!r}) & set(sys.modules)); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_PACKAGE.parent)
