"""The Flower app of ``benchmarks.vs_flower`` is real files (``benchmarks/flower_app``): the
benchmark copies them into the app directory that ``flwr run`` starts, as one package the
app's pyproject names."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from benchmarks import vs_flower

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def test_the_app_directory_holds_the_package_its_pyproject_names(tmp_path: Path) -> None:
    app = vs_flower.write_app(tmp_path, tmp_path / "spec.json", tmp_path / "out.json", clients=3)
    project = tomllib.loads((app / "pyproject.toml").read_text())
    flwr = project["tool"]["flwr"]["app"]
    assert flwr["config"] == {"spec-path": str(tmp_path / "spec.json"), "out-path": str(tmp_path / "out.json"),
                              "num-clients": 3}
    pkg = app / vs_flower.APP_PACKAGE
    for ref in flwr["components"].values():
        module, _, attr = ref.partition(":")
        package, _, name = module.partition(".")
        assert package == vs_flower.APP_PACKAGE
        tree = ast.parse((pkg / f"{name}.py").read_text())
        assert attr in {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                        if isinstance(t, ast.Name)}
    copied = {p.name for p in pkg.iterdir()}
    assert {"__init__.py", "common.py", "client_app.py", "server_app.py"} <= copied
    assert not copied & {"__pycache__", "app.toml"}
