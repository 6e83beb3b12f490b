"""How much CPU this process may use, and holding a process to a share of one core.

A node sizes torch's thread pool by the cores it may really use: the CPUs in its affinity
mask, and fewer when a cgroup CPU quota caps it (a container with ``--cpus=1.5``, or a test
that imitates a slow machine). ``CpuQuota`` makes such a cgroup (v1 ``/sys/fs/cgroup/cpu``, or v2):
the heterogeneity test and benchmark hold one node process to 10 % of a core with it. Each
cgroup has a unique name and is always removed, so parallel runs never collide.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from pathlib import Path

from gpuflex.errors import GpuflexError

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for ``controller`` (v1), or its v2 path ("" controller)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (controller in parts[1].split(",") or (not controller and parts[0] == "0")):
            return parts[2]
    return None


def quota_cores() -> float | None:
    """The cgroup CPU quota of this process in cores (0.1 = a tenth of one), or None if none."""
    path = _own_cgroup("cpu")
    try:
        if path is not None and (CGROUP_CPU / path.lstrip("/")).is_dir():
            base = CGROUP_CPU / path.lstrip("/")
            quota = int((base / "cpu.cfs_quota_us").read_text())
            period = int((base / "cpu.cfs_period_us").read_text())
            return quota / period if quota > 0 and period > 0 else None
        v2 = _own_cgroup("")
        if v2 is not None and (CGROUP_V2 / v2.lstrip("/") / "cpu.max").is_file():
            quota_s, period_s = (CGROUP_V2 / v2.lstrip("/") / "cpu.max").read_text().split()[:2]
            return int(quota_s) / int(period_s) if quota_s != "max" else None
    except (OSError, ValueError):
        return None
    return None


def usable_cores() -> int:
    """Whole cores this process may run on: its affinity, capped by its cgroup quota (≥ 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = quota_cores()
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


class QuotaUnavailable(GpuflexError, RuntimeError):
    """No cgroup CPU controller this process may write to (not root, or none enabled)."""


def v2_cpu_available() -> bool:
    """Whether a cgroup v2 hierarchy at ``CGROUP_V2`` offers the cpu controller to new
    cgroups under its root, enabling it there when it is offered but off (root only)."""
    controllers = CGROUP_V2 / "cgroup.controllers"
    subtree = CGROUP_V2 / "cgroup.subtree_control"
    try:
        if "cpu" not in controllers.read_text().split() or not os.access(CGROUP_V2, os.W_OK):
            return False
        if "cpu" not in subtree.read_text().split():
            subtree.write_text("+cpu")
        return "cpu" in subtree.read_text().split()
    except OSError:
        return False


class CpuQuota:
    """A fresh cgroup holding its processes to ``cores`` of CPU; a context manager that
    always removes it. Start a process in it with :meth:`prefix` (a command prefix that joins
    the cgroup, then execs the command)."""

    def __init__(self, cores: float, name: str = "gpuflex") -> None:
        quota_us = max(1000, int(cores * PERIOD_US))
        leaf = f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if (CGROUP_CPU / "cgroup.procs").exists() and os.access(CGROUP_CPU, os.W_OK):
            self.root = CGROUP_CPU  # cgroup v1: the cpu controller's own hierarchy
            files = {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota_us)}
        elif v2_cpu_available():
            self.root = CGROUP_V2  # cgroup v2: one hierarchy, the cpu controller enabled below root
            files = {"cpu.max": f"{quota_us} {PERIOD_US}"}
        else:
            raise QuotaUnavailable(f"no writable cgroup CPU controller (v1 at {CGROUP_CPU}, or v2 at {CGROUP_V2})")
        self.path = self.root / leaf
        try:
            self.path.mkdir()
            for key, value in files.items():
                (self.path / key).write_text(value)
        except OSError as exc:
            self.close()
            raise QuotaUnavailable(f"cannot make a CPU cgroup: {exc}") from None

    def prefix(self) -> tuple[str, ...]:
        """``sh -c 'echo $$ > cgroup.procs; exec "$@"'``: the command runs inside the cgroup
        from its first instruction, threads and children included."""
        return ("sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled(self) -> int:
        """How many quota periods the cgroup's processes were held back in (``cpu.stat``'s
        ``nr_throttled``): above zero once the quota has really slowed them."""
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "nr_throttled":
                    return int(value)
        return 0

    def close(self) -> None:
        """Move any process left back to the root cgroup, then remove the cgroup (bounded)."""
        if not self.path.exists():
            return
        for _ in range(50):
            with contextlib.suppress(OSError):
                for pid in (self.path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (self.root / "cgroup.procs").write_text(pid)
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
