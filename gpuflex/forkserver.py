"""Start many node processes on one machine without paying torch's start-up in each.

A node process spends about eight CPU-seconds importing torch (and its compiler stack, which
the first optimizer step pulls in), libp2p and scikit-learn before it serves anything. A local
mesh of five nodes paid that five times over, on a laptop's two cores. ``ForkServer`` starts
one launcher process that imports all of it once, then forks a fresh child for each node: the
child is a real, separate process running the same ``gpuflex node start`` entry point with its
own argv, environment, working directory, session and log file, and it shares the imported
code pages copy-on-write.

The launcher forks before any thread, CUDA context or OpenMP pool exists (it only imports),
which is what makes forking safe here; numpy's global generator is reseeded in each child
(Python's own ``random`` reseeds itself). When the process that owns the launcher goes away,
its stdin closes and the launcher kills every child it started, so nothing is left behind.

``GPUFLEX_LAUNCH=exec`` turns this off (each node is then a plain ``python -m gpuflex``).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from gpuflex.errors import GpuflexError

#: What a node imports before it can serve; a module missing here is simply skipped.
PRELOAD = (
    "numpy", "trio", "msgpack", "nacl.signing", "torch", "torch._dynamo", "torch.optim",
    "sklearn.datasets", "libp2p", "libp2p.kad_dht.kad_dht", "libp2p.relay.circuit_v2",
    "libp2p.discovery.mdns.mdns", "libp2p.security.noise.transport", "libp2p.tools.anyio_service",
    "mesh.node", "gpuflex.cli.main", "gpuflex.node.runtime", "gpuflex.ml.workload", "gpuflex.ml.train",
)
REAP_S = 0.05


class ForkServerError(GpuflexError, RuntimeError):
    """The launcher process died or answered nonsense."""


# -- the launcher (runs as ``python -m gpuflex.forkserver``) -------------------------------------


def _child(req: dict[str, Any], started: int) -> None:
    """In the forked child: become the requested command, then exit with its status. The
    launcher answers only once ``started`` is written, after ``setsid``, so that the owner can
    signal the child's process group as soon as it has the pid (as with ``Popen``)."""
    code = 1
    try:
        os.setsid()
        os.write(started, b"1")
        os.close(started)
        if req.get("netns"):
            _enter_netns(str(req["netns"]))
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        # As a fresh interpreter has it: a write to a socket its peer closed raises an error
        # (BrokenPipeError) that the node handles, instead of killing the node without a word.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[1:1] = extra
        module = req.get("module") or "gpuflex"
        sys.argv = [module, *req["argv"]]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the child must never return into the launcher loop
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _enter_netns(name: str) -> None:
    """What ``ip netns exec NAME`` does for a node: join that network namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, f"cannot enter network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _serve() -> None:
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    others = _other_threads()
    if others:
        print(f"gpuflex launcher: threads {others} after the imports; forked nodes may hang",
              file=sys.stderr, flush=True)
    else:  # Python warns at every fork of a process with threads, fork-safe ones included
        warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks")
    children: dict[int, int | None] = {}
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    buf = b""
    try:
        while True:
            _reap(children)
            ready, _, _ = select.select([0], [], [], REAP_S)
            if not ready:
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                if req["op"] == "spawn":
                    started_r, started_w = os.pipe()
                    pid = os.fork()
                    if pid == 0:
                        os.close(started_r)
                        _child(req, started_w)
                    os.close(started_w)
                    os.read(started_r, 1)  # empty if the child died before its setsid
                    os.close(started_r)
                    children[pid] = None
                    reply: dict[str, Any] = {"pid": pid}
                else:
                    _reap(children)
                    reply = {"code": children.get(int(req["pid"]))}
                out.write(json.dumps(reply) + "\n")
                out.flush()
    finally:
        for pid, code in children.items():
            if code is None:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        _reap(children)


#: Threads that survive a fork harmlessly: jemalloc (linked into some wheels) re-arms its locks
#: around fork and only loses background purging in the child.
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def _other_threads() -> list[str]:
    """Names of this process's threads besides the main one that a fork could break."""
    if not os.path.isdir("/proc/self/task"):
        return []
    names = []
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
    return [n for n in names if n not in FORK_SAFE_THREADS]


def _reap(children: dict[int, int | None]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children[pid] = os.waitstatus_to_exitcode(status)


# -- the owner's side ---------------------------------------------------------------------------


class ForkedProcess:
    """The part of ``subprocess.Popen`` a local mesh uses, for a child of the launcher."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(REAP_S)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # One BLAS thread: the launcher must hold no worker threads when it forks, and nodes
        # that share a machine gain nothing from BLAS threads competing for its cores.
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self._proc = subprocess.Popen([sys.executable, "-u", "-m", "gpuflex.forkserver"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                      start_new_session=True)
        self._ready = False

    def _ask(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            try:
                if not self._ready:
                    json.loads(self._proc.stdout.readline() or b"null")["ready"]
                    self._ready = True
                self._proc.stdin.write(json.dumps(req).encode() + b"\n")
                self._proc.stdin.flush()
                reply = json.loads(self._proc.stdout.readline() or b"null")
            except (OSError, ValueError, TypeError) as exc:
                raise ForkServerError(f"the node launcher (pid {self._proc.pid}) failed: {exc}") from None
            if not isinstance(reply, dict):
                raise ForkServerError(f"the node launcher (pid {self._proc.pid}) exited")
            return reply

    def spawn(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None,
              module: str = "gpuflex", netns: str = "") -> ForkedProcess:
        """Fork a child that runs ``python -m module *argv`` with this environment (inside
        network namespace ``netns`` when one is named)."""
        reply = self._ask({"op": "spawn", "argv": argv, "env": env, "log": str(log), "module": module,
                           "netns": netns,
                           "cwd": str(cwd or os.getcwd())})
        return ForkedProcess(self, int(reply["pid"]))

    def exit_code(self, pid: int) -> int | None:
        code = self._ask({"op": "poll", "pid": pid})["code"]
        return None if code is None else int(code)

    def close(self) -> None:
        """Closing stdin tells the launcher to kill what is left and exit."""
        with contextlib.suppress(Exception):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)


_shared: ForkServer | None = None
_shared_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("GPUFLEX_LAUNCH", "fork") != "exec" and hasattr(os, "fork")


def shared() -> ForkServer:
    """One launcher per process, started on first use and closed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._proc.poll() is not None:
            _shared = ForkServer()
            atexit.register(_shared.close)
        return _shared


if __name__ == "__main__":
    _serve()
