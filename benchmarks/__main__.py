"""Run the benchmarks in sequence: ``python -m benchmarks [NAME ...] [--quick] [--json]``.

Each benchmark runs in its own process, as ``python -m benchmarks.<name>``, so one that
fails or leaks memory cannot skew the next, and each has a time limit. ``--quick`` passes
small sizes, so the whole set finishes in under two minutes: a smoke test of the harness,
not figures to quote.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import log, stop_on_sigterm, stop_process

# name: (arguments for --quick, time limit in seconds for a full run)
BENCHMARKS: dict[str, tuple[list[str], float]] = {
    "blob_throughput": (["--mb", "20", "--reps", "2"], 600.0),
    "dht_lookup": (["--nodes", "8", "--lookups", "2", "--budget-s", "20"], 1200.0),
    "round_overhead": (["--nodes", "4", "--rounds", "2"], 1200.0),
    "aggregation_speed": (["--mb", "10", "--n", "4", "--reps", "1"], 600.0),
    "chaos": (["--quick"], 1200.0),
    "robustness": (["--quick"], 1800.0),
    "dp_accuracy": (["--quick"], 900.0),
    "secagg_overhead": (["--quick"], 600.0),
    "diloco_bytes": (["--quick"], 900.0),
    "vs_flower": (["--quick"], 2400.0),
    "vs_hivemind": (["--quick"], 3600.0),
    "nat": (["--rounds", "1", "--variant", "random-ports"], 1200.0),
    "heterogeneity": (["--quick"], 2400.0),
    "device_fit": (["--budget-s", "1"], 600.0),
    "upkeep": (["--nodes", "3", "4", "--seconds", "5", "--settle", "3"], 1800.0),
    "gossipsub_limit": (["--sizes-kib", "64", "1024"], 300.0),
}
QUICK_LIMIT_S = 120.0
# Benchmarks whose --quick run needs longer: vs_flower installs Flower on first use and starts
# a Flower deployment as well as a mesh; vs_hivemind starts hivemind's peers as well as a mesh.
QUICK_LIMITS_S: dict[str, float] = {"vs_flower": 360.0, "vs_hivemind": 360.0, "nat": 360.0,
                                    "heterogeneity": 600.0}  # three small meshes, one after another


def run_one(name: str, quick: bool, as_json: bool) -> tuple[int, Any]:
    """Run one benchmark; returns (exit code, parsed JSON or None). Output streams through
    unless JSON was asked for, in which case it is captured and parsed. Past its time limit a
    benchmark gets SIGINT, so it stops the processes it started, and then SIGKILL."""
    quick_args, limit = BENCHMARKS[name]
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *(quick_args if quick else []),
           *(["--json"] if as_json else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if as_json else None)
    try:
        out, _ = proc.communicate(timeout=QUICK_LIMITS_S.get(name, QUICK_LIMIT_S) if quick else limit)
    except subprocess.TimeoutExpired:
        log(f"{name}: over its time limit; stopping it")
        stop_process(proc, grace=30.0)
        return 124, None
    finally:
        stop_process(proc, grace=30.0)
    if not as_json or proc.returncode != 0:
        return proc.returncode, None
    try:
        return 0, json.loads(out)
    except ValueError:
        return 1, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes; the whole set in under 2 minutes")
    parser.add_argument("--json", action="store_true", help="one JSON object keyed by benchmark name")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    results: dict[str, Any] = {}
    failed: list[str] = []
    for name in args.names or list(BENCHMARKS):
        log(f"== {name}{' (quick)' if args.quick else ''}")
        started = time.monotonic()
        code, result = run_one(name, args.quick, args.json)
        log(f"== {name}: {'ok' if code == 0 else f'FAILED ({code})'} in {time.monotonic() - started:.0f}s")
        if code != 0:
            failed.append(name)
        results[name] = result
        if not args.json:
            print(flush=True)
    if args.json:
        print(json.dumps({"results": results, "failed": failed}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
