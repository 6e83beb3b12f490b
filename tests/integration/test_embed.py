"""The README's embedding example, run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_embedding_example_runs(tmp_path: Path) -> None:
    text = README.read_text()
    match = re.search(r"<!-- embed-example -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README lost its embedding example"
    script = tmp_path / "embed.py"
    script.write_text(match.group(1))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"peers: \['12D3KooW\w+'\]", proc.stdout), proc.stdout
