"""The architecture holds: import-linter's contracts (pyproject.toml, [tool.importlinter]), and
no module of the node grows past what one reader can hold (DESIGN.md: about 400 lines)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: DESIGN.md's "about 400 lines", with a little room before a split is due.
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
