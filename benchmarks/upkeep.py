"""What being a member costs when nothing happens, and how fast a killed member is noticed.

For each mesh size, real ``gpuflex node start`` processes on 127.0.0.1 (no job) are started,
left to settle until every node lists every other as up, and then measured:

* **idle upkeep**: CPU-seconds per second of each node process over ``--seconds`` (from
  /proc/<pid>/stat), median and max over the nodes, and the messages it sent (bytes from the
  ``status`` counters);
* **failure detection** (``--kill``): one node is killed with SIGKILL, and every other node's
  peer table is polled until it lists the victim as ``down``; the time for the last one.

``--old PATH`` runs the same measurements on another checkout (the landed code, say) in the
same invocation, one design after the other at each size, so the two are compared on the same
machine under the same load. Each design's nodes import that design's code only: they are
started as ``python -c`` with the checkout first on ``sys.path``.

Run:

    python -m benchmarks.upkeep [--nodes 4 16] [--seconds 30] [--kill] [--old /path/to/main] [--json]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_json_flag, emit, format_table, log, ratio, stop_on_sigterm
from benchmarks.procstat import cpu_seconds, open_sockets

HERE = Path(__file__).resolve().parent.parent


def launcher(checkout: Path) -> list[str]:
    """``python <launcher> node start ...`` running ``checkout``'s code, whatever the cwd."""
    code = (f"import runpy, sys; sys.path.insert(0, {str(checkout)!r}); "
            "runpy.run_module('gpuflex', run_name='__main__', alter_sys=True)")
    return ["-c", code]


def measure(design: str, checkout: Path, nodes: int, seconds: float, settle: float, kill: bool) -> dict[str, Any]:
    from gpuflex.localmesh import LocalMesh

    with tempfile.TemporaryDirectory(prefix=f"upkeep-{design}-{nodes}-") as tmp, \
            LocalMesh(Path(tmp), nodes, launcher=launcher(checkout), log_level="warning") as mesh:
        t0 = time.time()
        mesh.start(timeout=180)
        started = time.time() - t0
        try:
            connected: float | None = mesh.wait_connected(timeout=240)
        except TimeoutError:  # measured all the same: min_up in the table says how far it got
            connected = None
            log(f"{design} {nodes}: not every node listed every other as up within 240 s")
        log(f"{design} {nodes}: started in {started:.0f}s, all up {connected}s later; settling {settle:.0f}s")
        time.sleep(settle)
        pids = [mesh.procs[i].pid for i in range(nodes)]
        sent0 = [mesh.call(i, "status")["bytes_sent"] for i in range(nodes)]
        cpu0 = [cpu_seconds(p) for p in pids]
        w0 = time.time()
        time.sleep(seconds)
        wall = time.time() - w0
        cpu = [(cpu_seconds(p) - c) / wall for p, c in zip(pids, cpu0, strict=True)]
        sent = [(mesh.call(i, "status")["bytes_sent"] - s) / wall for i, s in zip(range(nodes), sent0, strict=True)]
        ups = mesh.up_counts()
        socks = [open_sockets(p) for p in pids]
        row: dict[str, Any] = {
            "design": design, "nodes": nodes, "cpu_median_pct": 100 * statistics.median(cpu),
            "cpu_max_pct": 100 * max(cpu), "bytes_sent_per_s": statistics.median(sent),
            "min_up": min(ups), "sockets_median": statistics.median(socks), "sockets_max": max(socks),
            "started_s": started, "connected_s": connected}
        if kill:
            row["detect_s"] = detect(mesh, nodes, victim=nodes // 2)
        log(f"{design} {nodes}: {row}")
        return row


def detect(mesh: Any, nodes: int, victim: int) -> float | None:
    """Seconds from SIGKILL of ``victim`` until the last other node lists it as down."""
    victim_id = mesh.call(victim, "status")["peer_id"]
    others = [i for i in range(nodes) if i != victim]
    mesh.kill(victim, signal.SIGKILL)
    killed = time.time()
    waiting = set(others)
    while waiting and time.time() - killed < 60:
        for i in list(waiting):
            rows = mesh.call(i, "peers")
            if any(r["peer_id"] == victim_id and r["state"] == "down" for r in rows):
                waiting.discard(i)
        time.sleep(0.25)
    if waiting:
        log(f"after 60 s, {len(waiting)} of {len(others)} nodes still did not list the killed node as down")
    return None if waiting else time.time() - killed


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    cols = [("design", "design", ""), ("nodes", "nodes", "d"), ("cpu_median_pct", "CPU % median", ".2f"),
            ("cpu_max_pct", "CPU % max", ".2f"), ("bytes_sent_per_s", "B sent/s", ".0f"),
            ("min_up", "min peers up", "d"), ("sockets_median", "sockets median", ".0f"),
            ("sockets_max", "sockets max", "d")]
    if any("detect_s" in r for r in rows):
        cols.append(("detect_s", "kill → down everywhere s", ".1f"))
    lines = [f"Idle upkeep per node process, no job, 127.0.0.1, {result['seconds']:.0f} s window "
             f"after {result['settle']:.0f} s settling", format_table(rows, cols)]
    for design, r in result["ratios"].items():
        lines.append(f"{design}: CPU at {r['big']} nodes / at {r['small']} nodes = {r['ratio']:.2f}")
    return "\n".join(lines)


def main() -> None:
    stop_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=35.0, help="seconds after all are up, before measuring")
    ap.add_argument("--kill", action="store_true", help="also time failure detection at the largest size")
    ap.add_argument("--old", type=Path, default=None, help="another checkout to measure in the same run")
    add_json_flag(ap)
    args = ap.parse_args()
    designs = [("new", HERE)] + ([("old", args.old.resolve())] if args.old else [])
    rows = []
    for nodes in sorted(args.nodes):
        for design, checkout in designs:
            rows.append(measure(design, checkout, nodes, args.seconds, args.settle,
                                args.kill and nodes == max(args.nodes)))
    ratios = {}
    small, big = min(args.nodes), max(args.nodes)
    for design, _ in designs:
        by = {r["nodes"]: r for r in rows if r["design"] == design}
        ratios[design] = {"small": small, "big": big,
                          "ratio": ratio(by[big]["cpu_median_pct"], by[small]["cpu_median_pct"])}
    emit({"rows": rows, "ratios": ratios, "seconds": args.seconds, "settle": args.settle}, args.json, render)


if __name__ == "__main__":
    main()
