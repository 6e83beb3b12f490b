"""The side-by-side benchmarks' venvs for other systems (``benchmarks.common.side_venv``),
made from a clean ``.bench/`` with a real ``python -m venv`` and nothing downloaded: the venv
is made in place, so its console scripts start (a moved venv's do not); a finished venv is
reused; an interrupted one, or one an older harness moved into place, is made again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import common

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def script_runs(venv: Path) -> bool:
    """``pip``, a console script like ``flower-superlink``, started as a user would."""
    try:
        done = subprocess.run([str(venv / "bin" / "pip"), "--version"], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:  # its first line names an interpreter that is not there
        return False
    return done.returncode == 0 and str(venv) in done.stdout


def test_side_venvs_are_made_in_place_reused_and_remade_when_broken(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "BENCH_VENVS", tmp_path / ".bench" / "venvs")
    python, version = common.side_venv("probe", "pip", [], pin=None)
    venv = python.parent.parent
    assert venv == tmp_path / ".bench" / "venvs" / "probe" and version
    assert script_runs(venv) and (venv / common.SIDE_DONE).exists()
    assert not (venv.parent / "probe.partial").exists()

    made = (venv / common.SIDE_DONE).stat().st_mtime_ns
    assert common.side_venv("probe", "pip", [], pin=None)[0] == python
    assert (venv / common.SIDE_DONE).stat().st_mtime_ns == made  # reused, not made again

    # What the older harness left: a venv made as probe.partial, then renamed into place.
    import shutil

    shutil.rmtree(venv)
    subprocess.run([common.sys.executable, "-m", "venv", str(venv.parent / "probe.partial")], check=True,
                   timeout=120)
    (venv.parent / "probe.partial").rename(venv)
    (venv / common.SIDE_DONE).write_text("pip\n")
    assert not script_runs(venv)  # its scripts still name probe.partial
    common.side_venv("probe", "pip", [], pin=None)
    assert script_runs(venv)

    (venv / common.SIDE_DONE).unlink()  # an install that stopped half-way: made again
    (venv / "left-over").write_text("")
    common.side_venv("probe", "pip", [], pin=None)
    assert (venv / common.SIDE_DONE).exists() and script_runs(venv) and not (venv / "left-over").exists()


def test_a_failed_install_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "BENCH_VENVS", tmp_path / ".bench" / "venvs")
    with pytest.raises(common.SideVenvError, match="no importable no_such_module_here"):
        common.side_venv("probe", "no_such_module_here", [], pin=None)
    assert not (tmp_path / ".bench" / "venvs" / "probe" / common.SIDE_DONE).exists()
