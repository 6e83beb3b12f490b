"""``CpuQuota`` on either cgroup version: the throttling tests set themselves up on a v1
machine and on a v2-only one (most current distributions), as root."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflex import cpuquota
from gpuflex.cpuquota import CpuQuota, QuotaUnavailable


def test_a_v2_only_hierarchy_gets_a_cpu_max_cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    v2 = tmp_path / "cgroup"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (v2 / "cgroup.subtree_control").write_text("cpu memory\n")
    (v2 / "cgroup.procs").write_text("")
    monkeypatch.setattr(cpuquota, "CGROUP_CPU", tmp_path / "no-v1")
    monkeypatch.setattr(cpuquota, "CGROUP_V2", v2)
    quota = CpuQuota(0.1, name="t")
    assert quota.path.parent == v2 and (quota.path / "cpu.max").read_text() == "10000 100000"
    assert quota.prefix()[2].startswith(f"echo $$ > {quota.path}/cgroup.procs")
    (quota.path / "cpu.max").unlink()  # cgroupfs removes a cgroup with its files; a plain directory does not
    quota.close()
    assert not quota.path.exists()


def test_no_cpu_controller_is_a_clear_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    v2 = tmp_path / "cgroup"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("memory pids\n")
    monkeypatch.setattr(cpuquota, "CGROUP_CPU", tmp_path / "no-v1")
    monkeypatch.setattr(cpuquota, "CGROUP_V2", v2)
    with pytest.raises(QuotaUnavailable, match="no writable cgroup CPU controller"):
        CpuQuota(0.1)
