"""Helpers every benchmark shares: timing, percentiles, tables, JSON output, bounded waits,
and worker processes that talk JSON lines.

The benchmarks move data between *processes*, because two peers sharing one Python thread
measure the GIL rather than the mesh. A worker is this same package run with a hidden
``--role`` argument: it reads one JSON command per line on stdin and answers one JSON line per
command on stdout. Closing its stdin tells it to stop, every wait on it is bounded, and
:class:`Worker` kills it (and its process group) on exit, so a failed run leaves nothing
behind.

trio is imported where it is used, not here: a benchmark's peers for another system run
their worker side in that system's own venv, which has numpy but not trio.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

MB = 1_000_000
MIB = 1 << 20


# -- timing and statistics ---------------------------------------------------------------------


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``; perf_counter, so monotonic."""

    def __init__(self) -> None:
        self.start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation, so the figure is one that was measured)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ratio(a: float, b: float) -> float:
    """a / b, NaN rather than an exception when b is zero or missing."""
    if not b or math.isnan(b) or math.isnan(a):
        return math.nan
    return a / b


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB


# -- output ------------------------------------------------------------------------------------


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt) if fmt else str(value)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A Markdown table (pastes into BENCHMARKS.md as is). Columns are (key, header, format
    spec); a column with a format spec holds numbers and is right-aligned, text is left-aligned."""
    cells = [[_cell(row.get(key), fmt) for key, _, fmt in columns] for row in rows]
    headers = [header for _, header, _ in columns]
    right = [bool(fmt) for _, _, fmt in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if r else "-") for w, r in zip(widths, right, strict=True)) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def emit(result: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    """Print ``result`` as JSON (for scripts and the runner) or as text from ``render``."""
    if as_json:
        print(json.dumps(result, indent=2, default=str), flush=True)
    else:
        print(render(result), flush=True)


def stop_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt, so ``finally`` blocks stop the processes a
    benchmark started even when a runner or CI job terminates it."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def stop_process(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGINT (clean-up runs), then SIGKILL after ``grace`` seconds; waits either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def log(message: str) -> None:
    """Progress goes to stderr, so stdout stays a clean table or JSON document."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- bounded waits -----------------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.5,
               what: str = "condition") -> float:
    """Poll ``predicate`` until true; returns seconds waited, raises TimeoutError at ``timeout``."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start >= timeout:
            raise TimeoutError(f"{what} not reached within {timeout:.0f}s")
        time.sleep(interval)


async def await_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    """The trio twin of :func:`wait_until`; returns False at ``timeout`` instead of raising,
    because inside a worker a partial result (reported as such) beats none."""
    import trio

    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(interval)
        return True
    return False


async def run_in_turns(per_node: Sequence[Sequence[Sequence[Callable[[], Awaitable[Any]]]]],
                       budget_s: float) -> tuple[list[Any], int]:
    """Run operations one at a time, one group per node per turn, until ``budget_s`` is spent.

    ``per_node[i]`` is node i's groups of operations. Going node by node, a group each, means
    that on an overloaded machine every node still gets its turn and a cut-short run samples
    every kind of operation. Returns the results and how many operations were planned. The
    clock is ``time.monotonic``, so trio and asyncio workers alike can use it.
    """
    schedule = [op for turn in itertools.zip_longest(*per_node) for group in turn if group for op in group]
    results: list[Any] = []
    deadline = time.monotonic() + budget_s
    for op in schedule:
        if time.monotonic() > deadline:
            break
        results.append(await op())
    return results, len(schedule)


# -- worker processes --------------------------------------------------------------------------


def add_role_flag(parser: argparse.ArgumentParser) -> None:
    """Hidden option that turns a benchmark module into one of its own worker processes."""
    parser.add_argument("--role", default="", help=argparse.SUPPRESS)
    parser.add_argument("--role-args", default="{}", help=argparse.SUPPRESS)


class WorkerError(RuntimeError):
    """A worker died, answered with an error, or did not answer in time."""


class Worker:
    """One worker process: ``python -m benchmarks.<module> --role <role>``, with this
    interpreter unless ``python`` names another (a peer of another system, in its own venv).

    ``args`` reach the worker's main with ``scratch`` added: a directory of its own inside the
    coordinator's temporary directory, so files survive no worker, even a killed one. Its stdout
    is read by a thread into a queue so that :meth:`recv` can time out; its stderr
    goes to a log file whose tail is quoted when it fails.
    """

    def __init__(self, module: str, role: str, args: dict[str, Any], log_dir: Path, name: str,
                 python: str = sys.executable) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        scratch = log_dir / name
        scratch.mkdir()
        args = {**args, "scratch": str(scratch)}
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(
                [python, "-m", f"benchmarks.{module}", "--role", role, "--role-args", json.dumps(args)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True,
            )
        self._lines: queue.Queue[bytes] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            self._lines.put(line)
        self._lines.put(b"")

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise WorkerError(f"{self.name} is gone:\n{self.log_tail()}") from None

    def recv(self, timeout: float) -> dict[str, Any]:
        """The next reply; raises WorkerError on an error reply, exit or timeout."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise WorkerError(f"{self.name} did not answer within {timeout:.0f}s:\n{self.log_tail()}") from None
        if not line:
            self.proc.wait(timeout=10)
            raise WorkerError(f"{self.name} exited with code {self.proc.returncode}:\n{self.log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(f"{self.name}: {reply['error']}\n{self.log_tail()}")
        return dict(reply)

    def ask(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(message)
        return self.recv(timeout)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def close_stdin(self) -> None:
        """The polite stop signal: a worker ends when its command stream ends."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    def close(self, grace: float = 10.0) -> None:
        """Ask politely (stdin EOF), then SIGKILL the whole process group."""
        self.close_stdin()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def workers(prefix: str) -> Iterator[tuple[Path, list[Worker]]]:
    """A scratch directory and a list to add workers to; all are closed and removed on exit."""
    with tempfile.TemporaryDirectory(prefix=f"gpuflex-bench-{prefix}-") as tmp:
        started: list[Worker] = []
        try:
            yield Path(tmp), started
        finally:
            for worker in started:  # all at once, so the grace periods overlap
                worker.close_stdin()
            deadline = time.monotonic() + 10.0
            for worker in started:
                worker.close(grace=max(0.1, deadline - time.monotonic()))


class Channel:
    """The worker side of :class:`Worker`: JSON commands on stdin, JSON replies on stdout."""

    async def recv(self, timeout: float) -> dict[str, Any] | None:
        """The next command, or None when the parent closed stdin or went quiet too long."""
        import trio

        with trio.move_on_after(timeout):
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            return json.loads(line) if line.strip() else None
        return None

    def send(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message, default=str) + "\n")
        sys.stdout.flush()


def describe_error(exc: BaseException) -> str:
    """``Name: message`` of the exceptions that really failed: nested exception groups (trio
    nurseries inside nurseries) are opened to their leaves, which a printed traceback hides
    past ten levels."""
    inner = getattr(exc, "exceptions", None)  # an exception group, built in or backported
    if isinstance(inner, (list, tuple)) and inner:
        return "; ".join(sorted({describe_error(e) for e in inner}))
    return f"{exc.__class__.__name__}: {exc}"


def run_worker(main: Callable[[Channel, dict[str, Any]], Any], args_json: str, deadline_s: float) -> None:
    """Run a worker's trio ``main`` under a hard deadline; errors go back as ``{"error"}``."""
    import trio

    channel = Channel()

    async def guarded() -> None:
        with trio.fail_after(deadline_s):
            await main(channel, json.loads(args_json))

    try:
        trio.run(guarded)
    except BaseException as exc:
        channel.send({"error": describe_error(exc)})
        raise


# -- side venvs for other systems --------------------------------------------------------------

BENCH_VENVS = Path(__file__).resolve().parent.parent / ".bench" / "venvs"
TORCH_PIN = "torch==2.13.0"  # exactly this: it resolves to the local CPU wheel, a range pulls CUDA
SIDE_INSTALL_TIMEOUT_S = 900.0


class SideVenvError(RuntimeError):
    """Another system's venv could not be made; the message is one line for the user."""


def _side_versions(python: Path, module: str, pinned: str | None = "torch") -> list[str] | None:
    """[module version, pinned module's version] as the venv reports them (just the first
    without ``pinned``); None if either will not import."""
    names = [module, *([pinned] if pinned else [])]
    probe = f"import {', '.join(names)}; print({', '.join(n + '.__version__' for n in names)})"
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    words = done.stdout.split()
    return words[:len(names)] if done.returncode == 0 and len(words) >= len(names) else None


#: Written into a side venv once it is complete and checked: a venv without it is a broken or
#: interrupted install and is made again.
SIDE_DONE = ".gpuflex-complete"


def _scripts_point_home(venv: Path) -> bool:
    """Whether every console script in ``venv/bin`` starts its own interpreter: a venv that
    was moved (an older harness built ``NAME.partial`` and renamed it) keeps the old path in
    its scripts' first line, so ``flower-superlink`` and the like cannot start."""
    home = str(venv / "bin") + "/"
    for script in (venv / "bin").iterdir():
        try:
            with script.open("rb") as f:
                first = f.readline(4096)
        except OSError:
            continue
        if first.startswith(b"#!") and b"python" in first and not first[2:].strip().decode(errors="replace"
                                                                                               ).startswith(home):
            return False
    return True


def side_venv(name: str, module: str, requirements: list[str], pin: str | None = TORCH_PIN) -> tuple[Path, str]:
    """The interpreter of ``.bench/venvs/NAME`` and the version of ``module`` in it.

    The venv is made once, in place (a venv's console scripts name its path, so it must never
    be moved): ``pin`` first (torch, so no requirement can swap in a CUDA build), then
    ``requirements`` under a constraint holding that pin. Only once ``module`` imports with the
    pinned version is the venv marked complete (``SIDE_DONE``), so an interrupted install
    never passes for a finished one: it is removed and made again.
    """
    venv = BENCH_VENVS / name
    python = venv / "bin" / "python"
    pin_module = pin.partition("==")[0] if pin else None
    pinned = pin.partition("==")[2] if pin else ""

    def usable(found: list[str] | None) -> bool:
        return found is not None and (pin is None or found[1].startswith(pinned))

    if (venv / SIDE_DONE).exists() and python.exists() and _scripts_point_home(venv):
        found = _side_versions(python, module, pin_module)
        if found is not None and usable(found):
            return python, found[0]
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(venv.with_name(venv.name + ".partial"), ignore_errors=True)  # an older harness's
    log(f"making the {name} venv in {venv} (once; a few minutes)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = venv / "constraints.txt"
    steps = [[sys.executable, "-m", "venv", str(venv)], *([[*pip, pin]] if pin else []),
             *([[*pip, *(["-c", str(constraints)] if pin else []), *requirements]] if requirements else [])]
    for step in steps:
        if pin and step is steps[-1] and len(steps) > 2:
            constraints.write_text(pin + "\n")
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=SIDE_INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SideVenvError(f"`{' '.join(step[-2:])}` took over {SIDE_INSTALL_TIMEOUT_S:.0f}s") from None
        if done.returncode:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            detail = (errors or done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SideVenvError(f"`{' '.join(step[-3:])}` failed: {detail}")
    found = _side_versions(python, module, pin_module)
    if found is None or not usable(found):
        raise SideVenvError(f"the {name} venv has {found or f'no importable {module}'}"
                            + (f", wanted {pin}" if pin else ""))
    (venv / SIDE_DONE).write_text(" ".join(found) + "\n")
    return python, found[0]
