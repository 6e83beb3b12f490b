"""A mesh of real node processes on loopback, for the demo, the tests and the benchmarks.

Each node is a separate ``gpuflex node start`` process with its own home, listening on
127.0.0.1 with an ephemeral port, and only the first node's address as bootstrap. Every wait
is bounded, and ``close()`` (also run on Ctrl-C) leaves no process behind. A test that cuts the
network between nodes places them in network namespaces of its own (see :class:`Placement`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflex import forkserver
from gpuflex.client import ControlClient, ControlError, call
from gpuflex.errors import GpuflexError
from gpuflex.home import CONTROL_FILE

DEFAULT_LAUNCHER = ("-m", "gpuflex")


class MeshStartError(GpuflexError, RuntimeError):
    """The local mesh did not come up in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now: where a restarted node is moved to."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Placement:
    """Where one node runs. A node in a network namespace listens on that namespace's address,
    is started through ``prefix`` (``ip netns exec NS``), and binds its control API to the
    namespace's own loopback, so every control call is made inside ``enter()``."""

    host: str = "127.0.0.1"
    prefix: tuple[str, ...] = ()
    netns: str = ""  # the namespace ``prefix`` enters, so a forked node can join it itself
    enter: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext


class LocalMesh:
    def __init__(self, base: Path, size: int, extra_args: Sequence[str] = (),
                 node_args: Callable[[int], Sequence[str]] | None = None, log_level: str = "info",
                 env: dict[str, str] | None = None, placement: Callable[[int], Placement] | None = None,
                 launcher: Sequence[str] = DEFAULT_LAUNCHER) -> None:
        self.base = Path(base)
        self.size = size
        self.extra_args = list(extra_args)
        self.node_args = node_args
        self.placement = placement or (lambda i: Placement())
        self.log_level = log_level
        self.env = {**os.environ, "GPUFLEX_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.launcher = list(launcher)  # how to run `gpuflex` (a test harness may wrap it)
        self.procs: dict[int, subprocess.Popen[bytes] | forkserver.ForkedProcess] = {}
        self.args: dict[int, list[str]] = {}  # the command line each node was last started with
        self.bootstrap: str | None = None

    def home(self, i: int) -> Path:
        return self.base / f"node{i}"

    def log_path(self, i: int) -> Path:
        return self.base / f"node{i}.log"

    # -- processes ---------------------------------------------------------------------------

    def start_node(self, i: int, wait: bool = True, timeout: float = 60.0, bootstrap: bool = True,
                   port: int = 0) -> None:
        """Start node ``i`` with the first node's original address as ``--bootstrap`` (none for
        the first node, or with ``bootstrap=False``); a restarted node rejoins through its book.
        ``port`` 0 lets the node pick (it keeps the port it had before, when free); another
        value moves it there."""
        home = self.home(i)
        home.mkdir(parents=True, exist_ok=True)
        (home / CONTROL_FILE).unlink(missing_ok=True)
        place = self.placement(i)
        cmd = [*place.prefix, sys.executable, *self.launcher, "node", "start", "--home", str(home),
               "--listen", f"/ip4/{place.host}/tcp/{port}", "--log-level", self.log_level, *self.extra_args]
        if self.node_args is not None:
            cmd += list(self.node_args(i))
        if bootstrap and self.bootstrap and i != 0:
            cmd += ["--bootstrap", self.bootstrap]
        self.args[i] = cmd
        if (not place.prefix or place.netns) and len(self.launcher) == 2 and self.launcher[0] == "-m" \
                and forkserver.enabled():
            # Forked from a launcher that imported torch and libp2p once (gpuflex/forkserver.py).
            args = cmd[len(place.prefix) + 3:]
            self.procs[i] = forkserver.shared().spawn(args, self.env, self.log_path(i), module=self.launcher[1],
                                                      netns=place.netns)
            return self._maybe_wait(i, wait, timeout)
        log = open(self.log_path(i), "ab")  # noqa: SIM115 - owned by the child process
        self.procs[i] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        log.close()
        return self._maybe_wait(i, wait, timeout)

    def _maybe_wait(self, i: int, wait: bool, timeout: float) -> None:
        if wait:
            self.wait_api(i, timeout)

    def wait_api(self, i: int, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            proc = self.procs.get(i)
            if proc is not None and proc.poll() is not None:
                tail = self.log_path(i).read_text(errors="replace")[-2000:]
                raise MeshStartError(f"node {i} exited with code {proc.returncode}:\n{tail}")
            if (self.home(i) / CONTROL_FILE).exists():
                try:
                    return self.call(i, "status", timeout=5)
                except ControlError:
                    pass
            time.sleep(0.2)
        raise MeshStartError(f"node {i} did not start within {timeout:.0f}s")

    def start(self, timeout: float = 90.0, count: int | None = None) -> None:
        """Start nodes 0..count-1 (all by default); node 0 first, the rest bootstrapping from it."""
        self.start_node(0, timeout=timeout)
        self.bootstrap = self.call(0, "status")["addrs"][0]
        rest = range(1, self.size if count is None else count)
        for i in rest:
            self.start_node(i, wait=False)
        for i in rest:
            self.wait_api(i, timeout)

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(i)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)

    def alive(self, i: int) -> bool:
        proc = self.procs.get(i)
        return proc is not None and proc.poll() is None

    def close(self, grace: float = 5.0) -> None:
        for i in list(self.procs):
            if self.alive(i):
                with contextlib.suppress(ControlError):
                    self.call(i, "shutdown", timeout=2)
        deadline = time.time() + grace
        for i, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.kill(i, signal.SIGKILL)
        self.procs.clear()

    def __enter__(self) -> LocalMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -----------------------------------------------------------------------------

    def call(self, i: int, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        with self.placement(i).enter():
            return call(method, params, home=self.home(i), timeout=timeout)

    def client(self, i: int) -> ControlClient:
        with self.placement(i).enter():  # the socket stays in the namespace it was made in
            return ControlClient.for_home(self.home(i))

    def wait_until(self, predicate: Callable[[], bool], timeout: float, interval: float = 0.5,
                   what: str = "condition") -> float:
        """Poll ``predicate`` until true; returns seconds waited, raises TimeoutError otherwise."""
        start = time.time()
        while time.time() - start < timeout:
            try:
                if predicate():
                    return time.time() - start
            except ControlError:
                pass
            time.sleep(interval)
        raise TimeoutError(f"{what} not reached within {timeout:.0f}s")

    def up_counts(self, nodes: Sequence[int] | None = None) -> list[int]:
        idx = range(self.size) if nodes is None else nodes
        return [sum(1 for p in self.call(i, "peers") if p["state"] == "up") for i in idx]

    def wait_connected(self, timeout: float = 60.0) -> float:
        live = [i for i in range(self.size) if self.alive(i)]
        need = len(live) - 1
        return self.wait_until(lambda: min(self.up_counts(live)) >= need, timeout, what="full discovery")

    def submit(self, spec: dict[str, Any], node: int = 0) -> str:
        return str(self.call(node, "job_submit", {"spec": spec}, timeout=30)["job_id"])

    def job(self, i: int, job: str) -> dict[str, Any]:
        return dict(self.call(i, "job_status", {"job": job}))

    def wait_job(self, job: str, nodes: Sequence[int], timeout: float,
                 on_tick: Callable[[dict[str, Any]], None] | None = None) -> None:
        def done() -> bool:
            states = [self.job(i, job) for i in nodes]
            if on_tick is not None:
                on_tick(states[0])
            failed = [s for s in states if s["state"] == "failed"]
            if failed:
                raise RuntimeError(f"job failed: {failed[0].get('error')}")
            return all(s["state"] == "done" for s in states)

        self.wait_until(done, timeout, interval=0.5, what=f"job {job} completion")
