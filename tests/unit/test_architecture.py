"""The architecture holds: import-linter's contracts (pyproject.toml, [tool.importlinter]), no
module of the node grows past what one reader can hold (docs/architecture.md: about 400 lines),
and the design of record, docs/architecture.md, names every module of the node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: docs/architecture.md's "about 400 lines", with a little room before a split is due.
MAX_NODE_MODULE_LINES = 420


def test_import_contracts_hold() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe), "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_node_module_is_over_about_400_lines() -> None:
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
             for p in (ROOT / "gpuflex" / "node").rglob("*.py")}
    assert sizes and all(n <= MAX_NODE_MODULE_LINES for n in sizes.values()), \
        {p: n for p, n in sizes.items() if n > MAX_NODE_MODULE_LINES}


def node_modules() -> list[str]:
    """Every module of ``gpuflex/node`` as the architecture names it: its path below the node,
    without ``.py`` (``driver``, ``roles/member``); packages' ``__init__`` left out."""
    node = ROOT / "gpuflex" / "node"
    return sorted(p.relative_to(node).with_suffix("").as_posix() for p in node.rglob("*.py") if p.name != "__init__.py")


def test_the_architecture_names_every_node_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    modules = node_modules()
    assert len(modules) > 30  # the walk found the node
    missing = [m for m in modules if f"`{m}`" not in doc]
    assert missing == [], f"docs/architecture.md does not name {missing}: add each to its layer"
