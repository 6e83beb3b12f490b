"""Utilisation over home uplinks: compute seconds over wall seconds per member, with and without
training ahead while the update travels (job option ``overlap``), side by side in one run.

The namespace topology of the NAT tests (``gpuflex/testing/nat.py``): one public
host and four homes behind nftables NAT routers whose uplinks ``tc tbf`` caps at 20 Mbit, five
node processes (the public one and one per home host). The model is a 52.8 MB MLP
(``big_mlp``: 64 → 3600 → 3600 → 10, fp32), trained with DiLoCo's AdamW inner steps and the
sparse codec (1/64 of each chunk at 2 bits), so an update weighs about 0.4 MB and its upload
takes a fraction of a second; what is left of a round's wall time is the protocol's: the plan,
the reduce up the tree, the step coming back, applying and hashing it.

The same mesh runs the same job twice, interleaved: ``overlap = 0`` and ``overlap = 0.5``.
Per member, utilisation is the training seconds it reports for rounds 3..N (steps trained
ahead included) over the wall time from round 2's commit to round N's on the first node.

Run (root; about ten minutes on two cores):

    .venv/bin/python -m benchmarks.overlap
    .venv/bin/python -m benchmarks.overlap --rounds 6 --steps 40 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import stop_on_sigterm

UPLINK_MBIT = 20.0
HIDDEN = 3600
ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "benchmarks.overlap:big_mlp"
#: A pause between two jobs: the nodes finish with one job before the next one's first round.
SETTLE_S = 20.0


def big_mlp(num_classes: int, input_shape: tuple[int, ...]) -> Any:
    """The benchmark's model: the built-in MLP, wide enough to weigh over 50 MB."""
    import math

    from gpuflex.ml.models import MLP

    return MLP(math.prod(input_shape), num_classes, hidden=HIDDEN)


def model_bytes(features: int = 64, classes: int = 10) -> int:
    params = features * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * classes + classes
    return params * 4


def job_spec(rounds: int, steps: int, overlap: float, seed: int) -> dict[str, Any]:
    from gpuflex.demo import demo_spec

    spec = demo_spec(rounds)
    spec.update(model=PLUGIN, min_nodes=5, group_size=4, local_epochs=0, local_steps=steps, strategy="diloco",
                optimizer="adamw", lr=1e-3, server_lr=1.0, server_momentum=0.0, codec="sparse",
                sparse_density=1 / 64, sparse_bits=2, overlap=overlap, seed=seed, name=f"overlap-{overlap:g}")
    return spec


def run_job(mesh: Any, rounds: int, steps: int, overlap: float, seed: int) -> dict[str, Any]:
    """One job to its end; the commit times seen on node 0 and each member's training seconds."""
    job = mesh.submit(job_spec(rounds, steps, overlap, seed))
    committed: dict[int, float] = {}
    deadline = time.monotonic() + 300 + 180 * rounds
    from gpuflex.client import ControlError

    while time.monotonic() < deadline:  # bounded: the job ends or the deadline passes
        try:
            status = mesh.job(0, job)
        except ControlError:  # a node busy training on a loaded machine answers late: ask again
            continue
        committed.setdefault(int(status["round"]), time.monotonic())
        if status["state"] in ("done", "failed"):
            break
        time.sleep(0.1)
    else:
        raise TimeoutError(f"overlap={overlap:g}: the job did not finish")
    mesh.wait_job(job, list(range(5)), timeout=60)
    rows = mesh.call(0, "ledger", {"job": job})
    first, last = 3, len(rows)
    wall = committed[last] - committed[first - 1]
    per_member: dict[str, float] = {}
    ahead: dict[str, int] = {}
    for row in rows[first - 1:]:
        for c in row["contributors"]:
            per_member[c["peer"]] = per_member.get(c["peer"], 0.0) + float(c.get("compute_s") or 0.0)
            ahead[c["peer"]] = ahead.get(c["peer"], 0) + int(c.get("ahead_steps") or 0)
    utilisation = sorted(round(s / wall, 3) for s in per_member.values())
    return {"overlap": overlap, "rounds": len(rows), "wall_s": round(wall, 2),
            "round_s": round(wall / (last - first + 1), 2),
            "utilisation": utilisation, "utilisation_median": utilisation[len(utilisation) // 2],
            "ahead_steps": sum(ahead.values()), "update_bytes": rows[-1]["metrics"].get("update_bytes"),
            "loss": rows[-1]["metrics"].get("loss")}


def run(rounds: int, steps: int, pairs: int, keep: Path | None = None) -> list[dict[str, Any]]:
    from gpuflex.localmesh import LocalMesh
    from gpuflex.testing.nat import NatTopology

    results = []
    with NatTopology((1, 1, 1, 1), uplink_mbit=UPLINK_MBIT) as topo, tempfile.TemporaryDirectory() as scratch:
        tmp = str(keep) if keep is not None else scratch  # ``--keep``: the nodes' homes and logs stay there
        hosts = topo.hosts()[:5]
        mesh = LocalMesh(Path(tmp), len(hosts), placement=lambda i: hosts[i].placement(),
                         env={"PYTHONPATH": str(ROOT)}, extra_args=["--allow-plugin", PLUGIN])
        try:
            mesh.start(timeout=120)
            mesh.wait_until(lambda: min(mesh.up_counts(range(5))) >= 4, 300, what="full discovery")
            for pair in range(pairs):
                for overlap in (0.0, 0.5):
                    results.append(run_job(mesh, rounds, steps, overlap, seed=pair))
                    print(_describe(results[-1]), flush=True)
                    time.sleep(SETTLE_S)
        finally:
            mesh.close()
    return results


def _describe(r: dict[str, Any]) -> str:
    return (f"overlap {r['overlap']:<4g} utilisation per member {r['utilisation']} (median "
            f"{r['utilisation_median']}); {r['round_s']} s a round; {r['ahead_steps']} steps trained ahead; "
            f"update bytes a round {r['update_bytes']}; final loss {r['loss']:.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40, help="local steps a round")
    parser.add_argument("--pairs", type=int, default=1, help="times each setting runs, interleaved")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, help="an empty directory for the nodes' homes and logs, kept afterwards")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    load = Path("/proc/loadavg").read_text().split()[:3]
    stop_on_sigterm()  # a SIGTERM unwinds, so the namespaces and nodes are always removed
    from gpuflex.testing.nat import NetnsUnavailable

    print(f"overlap benchmark {time.strftime('%Y-%m-%d')}, model {model_bytes() / 1e6:.1f} MB, uplinks "
          f"{UPLINK_MBIT:g} Mbit, {args.steps} local steps a round, load average at start {' '.join(load)}",
          flush=True)
    try:
        results = run(args.rounds, args.steps, args.pairs, args.keep)
    except NetnsUnavailable as exc:
        print(f"overlap: skipped, the NAT topology cannot be built here ({exc}); run it as root")
        return 0
    by = {o: [r["utilisation_median"] for r in results if r["overlap"] == o] for o in (0.0, 0.5)}
    off, on = sum(by[0.0]) / len(by[0.0]), sum(by[0.5]) / len(by[0.5])
    print(f"median utilisation: without overlap {off:.3f}, with overlap {on:.3f} ({on / off:.2f}×)")
    if args.json:
        print(json.dumps({"date": time.strftime("%Y-%m-%d"), "loadavg": load, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
