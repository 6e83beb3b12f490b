"""Side by side with Flower: the same federated job on a Flower deployment and on our mesh.

Both sides train the digits CNN of the demo job (same seeded initial weights, same Dirichlet
split, same rounds, local epochs, batch size and optimizer, FedAvg weighted by samples) with
4 and 8 clients as separate processes on 127.0.0.1, in the same run:

* **Flower** runs as a real deployment, not its simulation engine: one ``flower-superlink``
  process and N ``flower-supernode`` processes, with the ServerApp/ClientApp of
  ``benchmarks/flower_app`` copied into a temporary directory and launched with ``flwr run``.
  Flower lives in a venv of its own (``.bench/venvs/flower``, created on first use). Its
  ClientApp and ServerApp call this repository's own training code
  (``gpuflex.ml.workload.Workload``, on ``PYTHONPATH``), so the partition, the local training
  loop and the evaluation are the very same code; only the federation around them differs.
* **Ours** runs ``gpuflex node start`` processes (``LocalMesh``), no server.

Per side and size it reports:

* round seconds, the median over rounds of the time from one global model to the next:
  for Flower, between the server-side evaluations that follow each round; for us, between
  consecutive signed results (round 1: plan issued to result). Both include the evaluation
  of the new model on the test split, done once per round on both sides;
* compute seconds, the slowest client's local training in a round (median), so the rest of
  the round is what each framework adds; for Flower also the age of its per-message
  ClientApp process when training starts (interpreter, imports, data), part of that rest;
* bytes per round, all traffic between machines of a real deployment over the whole job,
  divided by the rounds, as TCP payload. Flower's SuperNodes reach the SuperLink through a
  byte-counting TCP proxy in this process (both directions); ServerApp-SuperLink and
  ClientApp-SuperNode traffic stays on one machine in a real deployment and is not counted.
  A mesh has no central link to tap, so ours runs in a network namespace of its own
  (``unshare``) and counts every TCP payload byte on that namespace's loopback from job
  submission until every node holds the last round: deltas, models, gossip, Noise and yamux
  framing, the DHT's and health checks' upkeep. Without namespaces it falls back to the
  nodes' own ``bytes_sent`` counters, which leave out framing and upkeep (10-20% less in
  our runs), and says so;
* final test accuracy, and peak RSS per client (a node; a SuperNode with its ClientApp
  subprocesses) and of Flower's server side, sampled from ``/proc`` every 0.25 s.

Run:

    python -m benchmarks.vs_flower [--clients 4 8] [--rounds 8] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BENCH_VENVS,
    MB,
    SideVenvError,
    Stopwatch,
    add_json_flag,
    add_role_flag,
    emit,
    format_table,
    log,
    ratio,
    side_venv,
    stop_on_sigterm,
    stop_process,
)

REPO = Path(__file__).resolve().parent.parent
FLOWER_VENV = BENCH_VENVS / "flower"
# flwr 1.42.0 needs a certifi newer than some mirrors carry, so the range lets pip settle on
# 1.41 there; the version that ran is printed with the results. torch stays at TORCH_PIN.
FLOWER_REQS = ["flwr>=1.41,<1.43", "numpy", "scikit-learn"]
KB = 1000
APP_PACKAGE = "gpuflex_flower_app"
FLOWER_APP = Path(__file__).resolve().parent / "flower_app"


class BenchError(RuntimeError):
    """A side could not be set up or did not finish; the message is one line for the user."""


# -- Flower's venv ------------------------------------------------------------------------------


def ensure_flower_venv() -> str:
    """Make the Flower venv if it is missing; returns the flwr version."""
    try:
        return side_venv("flower", "flwr", FLOWER_REQS)[1]
    except SideVenvError as exc:
        raise BenchError(f"cannot install Flower: {exc}") from None


# -- the Flower app (benchmarks/flower_app), copied into a temporary directory ------------------


def write_app(root: Path, spec_path: Path, out_path: Path, clients: int) -> Path:
    app = root / "app"
    shutil.copytree(FLOWER_APP, app / APP_PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.toml"))
    (app / "pyproject.toml").write_text((FLOWER_APP / "app.toml").read_text().format(
        package=APP_PACKAGE, spec_path=spec_path, out_path=out_path, clients=clients))
    return app


# -- measuring: a byte-counting proxy and an RSS sampler ----------------------------------------


class CountingProxy:
    """A TCP relay from a local port to ``target`` that counts the bytes in each direction.

    Flower's SuperNodes dial this instead of the SuperLink, so it sees exactly the traffic
    that would cross the network between clients and server."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = 0  # client -> server
        self.down = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def total(self) -> int:
        with self._lock:
            return self.up + self.down

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
                with self._lock:
                    if up:
                        self.up += len(chunk)
                    else:
                        self.down += len(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(roots: list[int], kids: dict[int, list[int]] | None = None) -> list[int]:
    """The roots and every process below them."""
    kids = _children() if kids is None else kids
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += kids.get(pid, [])
    return found


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """Peak resident memory of each named process tree (a process and its descendants),
    polled from /proc, since Flower's ClientApp processes live for one message each."""

    def __init__(self, roots: dict[str, int], interval: float = 0.25) -> None:
        self.roots = dict(roots)
        self.peak_kb = dict.fromkeys(roots, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            kids = _children()
            for name, root in self.roots.items():
                tree = descendants([root], kids)
                self.peak_kb[name] = max(self.peak_kb[name], sum(_rss_kb(p) for p in tree))

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(timeout=5)
        return {name: kb * 1024 / MB for name, kb in self.peak_kb.items()}


# -- the job both sides run ---------------------------------------------------------------------


def job_spec(clients: int, rounds: int) -> dict[str, Any]:
    """The demo job (digits CNN, Dirichlet α=0.5, 2 local epochs), every client in every round."""
    from gpuflex.demo import demo_spec
    from gpuflex.jobspec import JobSpec

    data = demo_spec(rounds)
    data.update(name=f"bench-vs-flower-{clients}", min_nodes=clients)
    return JobSpec.from_dict(data).to_dict()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def round_times(ends: list[float], first: float) -> list[float]:
    """Seconds per round from the times each round's model appeared; ``first`` is round 1's."""
    return [first, *(b - a for a, b in itertools.pairwise(ends))]


def summary(times: list[float], compute: list[float], accuracy: float, loss: float, job_s: float,
            wire_bytes: int, rounds: int, rss: dict[str, float], clients: int) -> dict[str, Any]:
    client_rss = [v for k, v in rss.items() if k.startswith("client")]
    return {
        "round_s": statistics.median(times), "round_max_s": max(times),
        "compute_s": statistics.median(compute), "job_s": job_s, "accuracy": accuracy, "loss": loss,
        "kb_per_round": wire_bytes / rounds / KB, "per_round": times,
        "client_rss_mb": max(client_rss) if client_rss else float("nan"),
        "server_rss_mb": rss.get("server", float("nan")), "clients": clients,
    }


# -- Flower -------------------------------------------------------------------------------------


@contextlib.contextmanager
def flower_processes(logs: Path, env: dict[str, str], cwd: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Yields ``spawn(log_name, program, *args)``; on the way out every process it started is
    stopped (SIGINT, then SIGKILL), and so is anything they started that outlived them."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, program: str, *args: str) -> subprocess.Popen[bytes]:
        with open(logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen([str(FLOWER_VENV / "bin" / program), *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        procs.append(proc)
        return proc

    try:
        yield spawn
    finally:
        spawned = descendants([p.pid for p in procs if p.poll() is None])
        for proc in reversed(procs):
            stop_process(proc, grace=10.0)
        for pid in spawned:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def log_tails(logs: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}" for f in sorted(logs.glob("*.log")))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str,
             watch: list[subprocess.Popen[bytes]], logs: Path) -> None:
    """Poll until true; fail at once, quoting the logs, when a watched process exits."""
    deadline = time.monotonic() + timeout
    while not predicate():
        dead = [p for p in watch if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            cause = (f"{Path(str(dead[0].args[0])).name} exited with code {dead[0].returncode}" if dead
                     else f"no {what} within {timeout:.0f}s")
            raise BenchError(f"Flower: {cause}; logs follow\n{log_tails(logs)}")
        time.sleep(0.25)


def read_marks(path: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads(path.read_text()))
    except (OSError, ValueError):
        return []


def run_flower(clients: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One Flower deployment: a SuperLink, N SuperNodes behind the proxy, one ``flwr run``."""
    rounds = int(spec["rounds"])
    with tempfile.TemporaryDirectory(prefix=f"gpuflex-bench-flower{clients}-") as tmp_name:
        tmp = Path(tmp_name)
        logs, home = tmp / "logs", tmp / "flwr-home"
        logs.mkdir()
        home.mkdir()
        spec_path, out_path = tmp / "spec.json", tmp / "rounds.json"
        spec_path.write_text(json.dumps(spec))
        app = write_app(tmp, spec_path, out_path, clients)
        link_port = free_port()
        (home / "config.toml").write_text(f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
                                          f'address = "127.0.0.1:{link_port}"\ninsecure = true\n')
        env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
               "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONPATH": str(REPO), "GPUFLEX_TORCH_THREADS": "1",
               "PATH": f"{FLOWER_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONUNBUFFERED": "1"}
        proxy: CountingProxy | None = None
        with flower_processes(logs, env, tmp) as spawn:
            log(f"Flower, {clients} clients: starting the SuperLink and {clients} SuperNodes")
            link = spawn("superlink", "flower-superlink", "--insecure", "--isolation", "subprocess",
                         "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
                         "--port", str(link_port), "--fleet-api-address", f"127.0.0.1:{free_port()}")
            wait_for(lambda: port_open(link_port), 60.0, "SuperLink port", [link], logs)
            proxy = CountingProxy(("127.0.0.1", link_port))
            nodes = [spawn(f"supernode{i}", "flower-supernode", "--insecure",
                           "--superlink", f"127.0.0.1:{proxy.port}",
                           "--node-config", f"partition-id={i} num-partitions={clients}",
                           "--host", "127.0.0.1", "--port", str(free_port()))
                     for i in range(clients)]
            sampler = RssSampler({"server": link.pid, **{f"client{i}": p.pid for i, p in enumerate(nodes)}})
            try:
                before = proxy.total()
                with Stopwatch() as job:
                    runner = spawn("flwr-run", "flwr", "run", str(app), "bench", "--stream")
                    wait_for(lambda: len(read_marks(out_path)) > rounds, 120.0 + rounds * (60.0 + 10.0 * clients),
                             "result for every round", [link, *nodes], logs)
                wire = proxy.total() - before
                with contextlib.suppress(subprocess.TimeoutExpired):
                    runner.wait(timeout=30)
            finally:
                rss = sampler.stop()
                proxy.close()
        marks = read_marks(out_path)
    ends = [float(m["t"]) for m in marks]
    times = round_times(ends[1:], ends[1] - ends[0])
    compute = [max(m["seconds"]) for m in marks[1:]]
    result = summary(times, compute, marks[-1]["accuracy"], marks[-1]["loss"], job.seconds, wire, rounds, rss,
                     clients)
    result["client_start_s"] = statistics.median(max(m["startup"]) for m in marks[1:])
    log(f"Flower, {clients} clients: round {result['round_s']:.2f}s, accuracy {result['accuracy']:.4f}, "
        f"{result['kb_per_round']:.0f} KB/round")
    return result


# -- ours ---------------------------------------------------------------------------------------


# Linux's loopback carries IPv4 (20 bytes) and TCP with timestamps (32) per packet and no
# link header, so payload = bytes - 52 x packets; SYNs' few extra option bytes are noise.
TCP_IP_HEADER = 52


def loopback_tcp_payload() -> int:
    """TCP payload bytes sent on this network namespace's loopback so far (/proc/net/dev is
    per namespace; /sys/class/net is not, unless sysfs is remounted)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            fields = rest.split()
            return int(fields[8]) - TCP_IP_HEADER * int(fields[9])
    raise BenchError("no loopback interface in /proc/net/dev")


def loopback_up() -> None:
    """A new network namespace starts with its loopback down."""
    import fcntl
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack("16sH", fcntl.ioctl(sock, siocgifflags, struct.pack("16sH22x", b"lo", 0))[:18])[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def ledger_lengths(mesh: Any, job: str) -> list[int]:
    """Rounds in each node's ledger file, read from disk so that waiting sends nothing."""
    from gpuflex.node.core.ledgerfile import LedgerError, read_ledger_file

    lengths = []
    for i in range(mesh.size):
        paths = sorted(mesh.home(i).glob(f"jobs/{job}*/ledger.msgpack"))
        try:
            lengths.append(len(read_ledger_file(paths[0])) if paths else 0)
        except (LedgerError, OSError):
            lengths.append(0)
    return lengths


def run_ours(clients: int, spec: dict[str, Any], isolated: bool) -> dict[str, Any]:
    """One mesh of ``clients`` node processes, one job; the same numbers as for Flower.

    ``isolated``: this process has a network namespace of its own, so every byte on its
    loopback between submitting the job and the last node holding the last round is mesh
    traffic; the wait reads ledger files rather than asking the nodes. Otherwise bytes come
    from the nodes' own counters, which leave out transport framing and the mesh's upkeep."""
    from benchmarks.round_overhead import training_seconds
    from gpuflex.localmesh import LocalMesh, MeshStartError

    rounds = int(spec["rounds"])
    timeout = 120.0 + rounds * (60.0 + 10.0 * clients)
    with tempfile.TemporaryDirectory(prefix=f"gpuflex-bench-vsflower{clients}-") as tmp:
        mesh = LocalMesh(Path(tmp), clients, log_level="warning")
        sampler: RssSampler | None = None
        try:
            log(f"ours, {clients} nodes: starting processes")
            mesh.start(timeout=60.0 + 10.0 * clients)
            mesh.wait_connected(timeout=60.0 + 5.0 * clients)
            sampler = RssSampler({f"client{i}": p.pid for i, p in mesh.procs.items()})
            counted = -sum(int(mesh.call(i, "status")["bytes_sent"]) for i in range(clients))
            with Stopwatch() as job:
                on_wire = -loopback_tcp_payload()
                job_id = mesh.submit(spec)
                if isolated:
                    mesh.wait_until(lambda: min(ledger_lengths(mesh, job_id)) >= rounds, timeout, interval=0.25,
                                    what=f"round {rounds} on every node")
                    on_wire += loopback_tcp_payload()
                mesh.wait_job(job_id, list(range(clients)), timeout=timeout)
            counted += sum(int(mesh.call(i, "status")["bytes_sent"]) for i in range(clients))
            rows = mesh.call(0, "ledger", {"job": job_id}, timeout=30)
            seconds = training_seconds(mesh.home(0), job_id)
        except (MeshStartError, TimeoutError, RuntimeError) as exc:
            raise BenchError(f"ours, {clients} nodes: {exc}") from None
        finally:
            rss = sampler.stop() if sampler is not None else {}
            mesh.close()
    times = round_times([float(r["ts"]) for r in rows], float(rows[0]["metrics"]["duration_s"]))
    compute = [max(seconds.get(r["round"], [0.0])) for r in rows]
    last = rows[-1]["metrics"]
    result = summary(times, compute, float(last["accuracy"]), float(last["loss"]), job.seconds,
                     on_wire if isolated else counted, rounds, rss, clients)
    result.update(counted_kb_per_round=counted / rounds / KB,
                  bytes_method="TCP payload on a private loopback" if isolated else "node counters")
    log(f"ours, {clients} nodes: round {result['round_s']:.2f}s, accuracy {result['accuracy']:.4f}, "
        f"{result['kb_per_round']:.0f} KB/round ({result['bytes_method']}; the nodes counted "
        f"{result['counted_kb_per_round']:.0f})")
    return result


UNSHARE = ["unshare", "--net", "--map-root-user"]


def run_ours_isolated(clients: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Run :func:`run_ours` in a network namespace of its own (``unshare``), so the bytes on its
    loopback are the mesh's alone; where namespaces are not allowed, run it here and count
    with the nodes' counters, saying so in the results."""
    try:
        usable = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        usable = False
    if not usable:
        log("no network namespace for the mesh (unshare failed): bytes from the nodes' own counters")
        return run_ours(clients, spec, isolated=False)
    args = json.dumps({"clients": clients, "spec": spec})
    proc = subprocess.Popen([*UNSHARE, sys.executable, "-m", "benchmarks.vs_flower", "--role", "ours",
                             "--role-args", args], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=300.0 + int(spec["rounds"]) * (60.0 + 10.0 * clients))
    except subprocess.TimeoutExpired:
        raise BenchError(f"ours, {clients} nodes: over the time limit") from None
    finally:
        stop_process(proc, grace=30.0)
    lines = out.strip().splitlines()
    reply = json.loads(lines[-1]) if lines else {"error": f"exited with code {proc.returncode}"}
    if "error" in reply:
        raise BenchError(str(reply["error"]))
    return dict(reply)


def ours_role(args: dict[str, Any]) -> None:
    """The namespaced side of :func:`run_ours_isolated`: one JSON line on stdout."""
    try:
        loopback_up()
        reply = run_ours(int(args["clients"]), dict(args["spec"]), isolated=True)
    except BenchError as exc:
        reply = {"error": str(exc)}
    print(json.dumps(reply), flush=True)


# -- the comparison -----------------------------------------------------------------------------


def run(sizes: list[int], rounds: int) -> dict[str, Any]:
    flwr_version = ensure_flower_venv()
    rows: list[dict[str, Any]] = []
    for n in sizes:
        spec = job_spec(n, rounds)
        row: dict[str, Any] = {"clients": n}
        for side, fn in (("flower", run_flower), ("ours", run_ours_isolated)):
            try:
                row[side] = fn(n, spec)
            except BenchError as exc:
                log(str(exc))
                row[side] = {"error": str(exc).splitlines()[0]}
            time.sleep(1.0)  # let one side's sockets and processes go before the next
        rows.append(row)
    return {"benchmark": "vs_flower", "flwr": flwr_version, "rounds": rounds, "rows": rows,
            "spec": {k: job_spec(sizes[0], rounds)[k] for k in ("model", "data", "partition", "alpha",
                                                                 "local_epochs", "batch_size", "lr", "optimizer")}}


METRICS = [("round_s", "round s", ".2f"), ("compute_s", "compute s", ".2f"),
           ("client_start_s", "client start s", ".2f"), ("kb_per_round", "KB/round", ".0f"),
           ("accuracy", "accuracy", ".4f"), ("client_rss_mb", "RSS/client MB", ".0f"),
           ("server_rss_mb", "server RSS MB", ".0f"), ("job_s", "job s", ".1f")]
# Flower alone starts a process per message and has a server.
RATIO_METRICS = [m for m in METRICS if m[0] not in ("client_start_s", "server_rss_mb")]


def side_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"clients": row["clients"], "side": name, **row[key]} for row in result["rows"]
            for name, key in (("Flower", "flower"), ("GPUFlex mesh", "ours")) if "error" not in row[key]]


def ratio_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """ours / Flower for each figure both sides have, per size (below 1: ours is smaller)."""
    out = []
    for row in result["rows"]:
        flower, ours = row["flower"], row["ours"]
        if "error" not in flower and "error" not in ours:
            out.append({"clients": row["clients"], **{k: ratio(ours[k], flower[k]) for k, _, _ in RATIO_METRICS}})
    return out


def render(result: dict[str, Any]) -> str:
    s = result["spec"]
    methods = sorted({row["ours"]["bytes_method"] for row in result["rows"] if "bytes_method" in row["ours"]})
    columns = [("clients", "clients", ""), ("side", "", ""), *METRICS]
    lines = [
        f"Against Flower {result['flwr']} (SuperLink + SuperNodes, `flwr run`): {s['model']} on {s['data']}, "
        f"{s['partition']} α={s['alpha']}, {result['rounds']} rounds × {s['local_epochs']} local epochs, batch "
        f"{s['batch_size']}, {s['optimizer']} lr {s['lr']}, FedAvg; processes on 127.0.0.1; round s and compute s are "
        "medians over rounds; client start s = age of Flower's per-message ClientApp process when training "
        "starts (slowest client); KB/round = whole job / rounds, client-server TCP payload through a proxy (Flower), "
        f"{' / '.join(methods) or '-'} (ours); RSS = peak per client process tree, and of Flower's SuperLink tree",
        format_table(side_rows(result), columns),
        "",
        "ours / Flower (below 1: ours is faster, smaller or lighter)",
        format_table(ratio_rows(result), [("clients", "clients", ""), *((k, h, ".2f") for k, h, _ in RATIO_METRICS)]),
    ]
    lines += [f"{row['clients']} clients, {side}: FAILED: {row[side]['error']}"
              for row in result["rows"] for side in ("flower", "ours") if "error" in row[side]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[4, 8], help="federation sizes")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="4 clients, 3 rounds: a smoke test")
    add_json_flag(parser)
    add_role_flag(parser)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    if args.role == "ours":
        ours_role(json.loads(args.role_args))
        return
    if args.quick:
        args.clients, args.rounds = [4], 3
    if min(args.clients) < 2 or args.rounds < 2:
        parser.error("--clients must be ≥ 2 and --rounds ≥ 2")
    try:
        result = run(args.clients, args.rounds)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    emit(result, args.json, render)
    if any("error" in row[side] for row in result["rows"] for side in ("flower", "ours")):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
