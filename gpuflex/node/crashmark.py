"""Plug-in jobs whose code was running when this node last stopped without shutting down.

A plug-in is someone's code in this process: if it kills the node (``os.abort``, a segfault in
an extension, memory exhaustion), a node that resumed every saved job at start would run it
again and die again, seconds after every restart. So while a plug-in job's code runs on a
worker thread (building its model, training, evaluating), a marker file sits in the job's
directory; it is removed when the code returns, including on a clean shutdown, which waits for
worker threads. A marker found at start means the node stopped inside that job's code: the job
is not resumed, the operator is told which file to delete to let it run again, and the
node's other jobs go on. Jobs made of built-in components only are never marked: their code is
this product's, and a crash there is a bug to fix, not a job to hold.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from mesh.fsutil import atomic_write

MARKER = "plugin_running"


class CrashMarks:
    def __init__(self, jobs_dir: Path) -> None:
        self.jobs_dir = jobs_dir
        self._depth: Counter[str] = Counter()  # job -> its plug-in calls running now

    def marker(self, job_id: str) -> Path:
        return self.jobs_dir / job_id / MARKER

    def stopped_inside(self, job_id: str) -> bool:
        """At start: whether the node last stopped while this job's plug-in code ran."""
        return self._depth[job_id] == 0 and self.marker(job_id).exists()

    @contextmanager
    def running(self, job_id: str) -> Iterator[None]:
        """Marks ``job_id`` for as long as any of its plug-in calls runs."""
        if self._depth[job_id] == 0:
            with suppress(OSError):  # a full disk: the job runs unmarked rather than not at all
                atomic_write(self.marker(job_id), f"{time.time():.0f}\n".encode())
        self._depth[job_id] += 1
        try:
            yield
        finally:
            self._depth[job_id] -= 1
            if self._depth[job_id] <= 0:
                del self._depth[job_id]
                self.marker(job_id).unlink(missing_ok=True)
