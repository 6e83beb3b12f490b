"""Training across home NATs: round time against the uplink bound, relay bytes, join time.

The namespace topology of the NAT tests (``gpuflex/testing/nat.py``): one public
host, four homes behind nftables NAT routers whose uplinks ``tc tbf`` caps at 20 Mbit, two
hosts on the first home's LAN. Five node processes (the public one and one per home host),
every home node started with the public node's address only, run a job whose model is a
10.7 MB MLP (``wide_mlp`` below: 64 → 1600 → 1600 → 10, fp32). Two variants run side by side:

* ``port-preserving``: routers keep source ports where they can (most home routers), so
  py-libp2p's DCUtR can punch holes between homes;
* ``random-ports``: ``masquerade fully-random``: no hole can be punched, a relay carries every
  home-to-home connection.

Per variant it prints:

* round time (the root's ``duration_s``) against the lower bound set by the bytes a node must
  push through its capped uplink: every home uploads one update of the model's size (leaders
  sit on the public node, so no home uploads more), hence bound = model bytes × 8 / uplink;
* bytes through the relay against all bytes the nodes sent;
* home-to-home connections that ended up direct (hole punched) or relayed;
* the seconds a new home node (a sixth process, in the last home) takes from listening to
  being ``up`` for every other node.

Run (root; about three minutes):

    .venv/bin/python -m benchmarks.nat            # both variants
    .venv/bin/python -m benchmarks.nat --rounds 2 --variant random-ports
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
HIDDEN = 1600
ROOT = Path(__file__).resolve().parents[1]


def wide_mlp(num_classes: int, input_shape: tuple[int, ...]) -> Any:
    """The benchmark's model: the built-in MLP, wide enough to weigh 10.7 MB."""
    import math

    from gpuflex.ml.models import MLP

    return MLP(math.prod(input_shape), num_classes, hidden=HIDDEN)


def model_bytes(features: int = 64, classes: int = 10) -> int:
    params = features * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * classes + classes
    return params * 4


def run_variant(name: str, rounds: int) -> dict[str, Any]:
    from gpuflex.demo import demo_spec
    from gpuflex.localmesh import LocalMesh
    from gpuflex.testing.nat import NatTopology

    with NatTopology((2, 1, 1, 1), uplink_mbit=UPLINK_MBIT, random_ports=name == "random-ports") as topo, \
            tempfile.TemporaryDirectory() as tmp:
        hosts = [*topo.hosts()[:5], topo.homes[3].hosts[0]]  # pub, h1a, h1b, h2a, h3a; the newcomer in h4a
        mesh = LocalMesh(Path(tmp), len(hosts), placement=lambda i: hosts[i].placement(),
                         env={"PYTHONPATH": str(ROOT)})
        try:
            t0 = time.time()
            mesh.start(timeout=120, count=5)
            mesh.wait_until(lambda: min(mesh.up_counts(range(5))) >= 4, 120, what="full discovery")
            ready = time.time() - t0
            spec = demo_spec(rounds)
            spec.update(model="benchmarks.nat:wide_mlp", min_nodes=5, local_epochs=1, group_size=4)
            job = mesh.submit(spec)
            t1 = time.time()
            mesh.wait_job(job, list(range(5)), timeout=120 + 60 * rounds)
            job_s = time.time() - t1
            metrics = mesh.job(0, job)["metrics"]
            ledger = mesh.call(0, "ledger", {"job": job})
            public_id = mesh.call(0, "status")["peer_id"]
            retries = sum(row["attempt"] for row in ledger)
            public_roots = sum(row["coordinator"] == public_id for row in ledger)
            statuses = [mesh.call(i, "status") for i in range(5)]
            relay = statuses[0]["nat"]["relay_load"]
            sent = sum(s["bytes_sent"] for s in statuses)
            ids = [s["peer_id"] for s in statuses]
            house = {ids[1]: 1, ids[2]: 1, ids[3]: 2, ids[4]: 3}
            links: dict[str, int] = {}
            for i in range(1, 5):
                for p in mesh.call(i, "peers"):
                    if p["peer_id"] in house and house[p["peer_id"]] != house[ids[i]]:
                        links[p["connection"]] = links.get(p["connection"], 0) + 1
            # A newcomer: a sixth node in the fourth home.
            mesh.start_node(5, wait=True, timeout=120)
            newcomer = mesh.call(5, "status")
            since = newcomer["nat"]["listening_since"]

            def up_everywhere() -> bool:
                return all(any(p["peer_id"] == newcomer["peer_id"] and p["state"] == "up"
                               for p in mesh.call(i, "peers")) for i in range(5))

            try:
                mesh.wait_until(up_everywhere, 120, interval=0.25, what="newcomer up everywhere")
                join_s: float | None = time.time() - since
            except TimeoutError:
                join_s = None
        finally:
            mesh.close()
    bound = model_bytes() * 8 / (UPLINK_MBIT * 1e6)
    durations = [m["duration_s"] for m in metrics if m.get("duration_s")]
    return {
        "variant": name, "rounds": len(metrics), "mesh_ready_s": round(ready, 1), "job_s": round(job_s, 1),
        "round_s": [round(d, 2) for d in durations], "bound_s": round(bound, 2),
        "ratio_median": round(sorted(durations)[len(durations) // 2] / bound, 2) if durations else None,
        "relayed_bytes": relay.get("relayed_bytes", 0), "bytes_sent_all": sent,
        "relayed_share": round(relay.get("relayed_bytes", 0) / max(1, sent), 4),
        "circuits_served": relay.get("circuits_served", 0), "cross_home_links": links,
        "newcomer_up_everywhere_s": None if join_s is None else round(join_s, 1),
        "retried_attempts": retries, "rounds_rooted_on_public": public_roots,
    }


def _describe(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"\n[{r['variant']}]  failed: {r['error']}"
    up_s = r["newcomer_up_everywhere_s"]
    newcomer = "never" if up_s is None else f"{up_s}s after it listened"
    return "\n".join([
        f"\n[{r['variant']}]  mesh ready in {r['mesh_ready_s']}s, {r['rounds']} rounds in {r['job_s']}s "
        f"({r['retried_attempts']} retried attempts; {r['rounds_rooted_on_public']} rounds rooted on the public node)",
        f"  round time {r['round_s']} s; uplink bound {r['bound_s']} s; median ratio {r['ratio_median']}×",
        f"  relayed {r['relayed_bytes'] / 1e6:.2f} MB of {r['bytes_sent_all'] / 1e6:.1f} MB sent "
        f"({r['relayed_share'] * 100:.2f}%), {r['circuits_served']} circuits; cross-home links {r['cross_home_links']}",
        f"  a new home node was up for every peer: {newcomer}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", choices=("port-preserving", "random-ports", "both"), default="both")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    variants = ("port-preserving", "random-ports") if args.variant == "both" else (args.variant,)
    load = Path("/proc/loadavg").read_text().split()[:3]
    stop_on_sigterm()  # a SIGTERM unwinds, so the namespaces and nodes are always removed
    from gpuflex.testing.nat import NetnsUnavailable


    if not args.json:
        print(f"NAT benchmark {time.strftime('%Y-%m-%d')}, model {model_bytes() / 1e6:.1f} MB, uplinks "
              f"{UPLINK_MBIT:g} Mbit, load average at start {' '.join(load)}", flush=True)
    results = []
    for variant in variants:
        try:
            r = run_variant(variant, args.rounds)
        except NetnsUnavailable as exc:
            print(f"nat: skipped, the NAT topology cannot be built here ({exc}); run it as root")
            return 0
        except TimeoutError as exc:  # say what did not happen, and go on to the next variant
            r = {"variant": variant, "error": str(exc)}
        results.append(r)
        if not args.json:
            print(_describe(r), flush=True)
    if args.json:
        print(json.dumps({"date": time.strftime("%Y-%m-%d"), "loadavg": load, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
