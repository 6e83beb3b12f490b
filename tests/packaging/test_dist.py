"""The wheel that ``just dist`` builds: every package file in it, and it installs and runs alone.

The build runs on a copy of the files git tracks (and untracked ones it does not ignore), as a
fresh clone would, so a stale build/ or egg-info folder cannot hide a missing package-data rule.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpuflex import __version__

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mesh", "aggregation", "gpuflex", "tui", "gpuflex_web")
BUILD_TIMEOUT_S = 300

pytestmark = pytest.mark.slow


def _source_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git to list the source files (not a git checkout)")
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Build the sdist and, from it, the wheel, as ``just dist`` does (without isolation, so
    the test needs no network: the dev extra pins setuptools and build)."""
    pytest.importorskip("build", reason="the dev extra's `build` is not installed")
    base = tmp_path_factory.mktemp("dist")
    src, out = base / "src", base / "dist"
    files = _source_files()
    for rel in files:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                          env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, files


def test_dist_holds_a_wheel_and_an_sdist_of_this_version(built: tuple[Path, list[str]]) -> None:
    out, _ = built
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"gpuflex-{__version__}-py3-none-any.whl", f"gpuflex-{__version__}.tar.gz"]


def test_the_wheel_holds_every_package_file_and_no_tests(built: tuple[Path, list[str]]) -> None:
    out, files = built
    wheel = zipfile.ZipFile(next(out.glob("*.whl"))).namelist()
    wanted = {f for f in files if f.split("/", 1)[0] in PACKAGES}
    missing = sorted(wanted - set(wheel))
    assert not missing, f"package files missing from the wheel: {missing}"
    # The data files that the package-data rules exist for, by name, so an emptied glob fails too.
    for data in ("gpuflex/templates/job.toml", "gpuflex/templates/lora.toml", "gpuflex/py.typed",
                 "tui/dashboard.tcss", "gpuflex_web/templates/join.html", "gpuflex_web/static/style.css"):
        assert data in wheel
    assert not [n for n in wheel if n.startswith(("tests/", "benchmarks/"))]
    assert f"gpuflex-{__version__}.dist-info/entry_points.txt" in wheel


def test_the_wheel_installs_alone_and_runs(built: tuple[Path, list[str]], tmp_path: Path) -> None:
    out, _ = built
    target = tmp_path / "site"
    wheel = next(out.glob("*.whl"))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Only the installed copy of GPUFlex on the path (its dependencies come from this venv).
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import gpuflex, gpuflex_web, tui; print(gpuflex.__file__); "
                            "from gpuflex.jobspec import example_job_toml; example_job_toml('lora')"],
                           env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert where.returncode == 0, where.stderr[-3000:]
    assert Path(where.stdout.strip()).is_relative_to(target)
    # The portal finds the wheel it was installed from (pip's direct_url.json) for the Join page.
    found = subprocess.run([sys.executable, "-c", "from pathlib import Path; from gpuflex import __version__; "
                            "from gpuflex_web.wheel import WheelFinder, wheel_dirs; "
                            "w = WheelFinder(__version__, wheel_dirs(Path('no-home'))).find(); "
                            "print(w.path, w.sha256)"],
                           env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert found.returncode == 0, found.stderr[-3000:]
    assert found.stdout.split() == [str(wheel), hashlib.sha256(wheel.read_bytes()).hexdigest()]
    script = target / "bin" / "gpuflex"
    version = subprocess.run([str(script), "--version"], env=env, capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
    assert version.returncode == 0, version.stderr[-3000:]
    assert version.stdout.strip() == f"gpuflex {__version__}"
