"""What /proc says of a node process the benchmarks started: its CPU time, memory and open
files. One reader for ``upkeep`` and ``realmesh``; a process that has already exited reads as
zero, so a measurement that outlives a node still finishes."""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds the process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def pss_mb(pid: int) -> float:
    """Proportional set size: shared pages split among the processes that share them."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def open_sockets(pid: int) -> int:
    """Open sockets of a node process: its peer connections, plus its listeners and the
    control API's (a handful, the same for every node)."""
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    count = 0
    for name in entries:
        try:
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
        except OSError:  # closed meanwhile
            continue
    return count
