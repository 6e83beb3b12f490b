"""Secure-aggregation overhead in bytes and time against plain FedAvg (in-process).

One group: a leader and g masking members, a float32 model of N parameters. Plain FedAvg
sends N float32 per member and the leader folds them into a running mean; secure aggregation
sends N uint32 (masked, same size) plus the encrypted Shamir shares of the pairwise seeds,
and the leader sums in the ring and unmasks the sum. Times are per member (encode: quantise,
g - 1 mask expansions, shares) and for the leader (decode + reduce), and for the leader's
recovery when one member drops. All in one process, so no transport cost is counted: the
byte counts are what the wire carries for the delta.

Run:

    python -m benchmarks.secagg_overhead [--sizes 100000 1000000] [--groups 4 8] [--quick]
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks.common import Stopwatch, add_json_flag, emit, format_table, stop_on_sigterm


def measure(size: int, members: int) -> dict[str, Any]:
    from gpuflex.jobspec import JobSpec
    from gpuflex.node.pipeline import DeltaEncoder, decode_payload, make_reducer, secagg_member
    from mesh.identity import Identity

    plain_spec = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits"})
    sa_spec = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "secure_aggregation": True})
    ids = [Identity(bytes([i + 1]) * 32) for i in range(members + 1)]
    leader = ids[0].peer_id
    plan = SimpleNamespace(job="bench", round=1, attempt=0,
                           parent={i.peer_id: (None if i.peer_id == leader else leader) for i in ids})
    rng = np.random.default_rng(0)
    deltas = [rng.normal(0, 0.05, size).astype(np.float32) for _ in ids[1:]]

    def run(spec: JobSpec, drop: int = 0) -> tuple[int, float, float]:
        enc = DeltaEncoder(spec)
        payloads, sides = [], {}
        with Stopwatch() as member:
            for ident, delta in zip(ids[1 + drop:], deltas[drop:], strict=True):
                side = secagg_member(spec, ident, plan)  # None for plain FedAvg
                sides[ident.peer_id] = side
                payloads.append((ident.peer_id, enc.encode(delta, 100, side)))
        red = make_reducer(spec, True, plan=plan, me=leader)
        with Stopwatch() as lead:
            for peer, payload in payloads:
                red.add(decode_payload(spec, payload, size), 100.0, peer)
            if drop:
                for holder, request in red.recovery_requests().items():  # type: ignore[attr-defined]
                    red.add_answers(holder, sides[holder].answer(request))  # type: ignore[attr-defined]
            red.result()
        return len(payloads[0][1]), member.seconds / len(payloads), lead.seconds

    plain_bytes, plain_member, plain_leader = run(plain_spec)
    sa_bytes, sa_member, sa_leader = run(sa_spec)
    _, _, drop_leader = run(sa_spec, drop=1)
    return {"params": size, "group": members, "plain_bytes": plain_bytes, "secagg_bytes": sa_bytes,
            "traffic_ratio": sa_bytes / plain_bytes, "plain_member_ms": plain_member * 1e3,
            "secagg_member_ms": sa_member * 1e3, "plain_leader_ms": plain_leader * 1e3,
            "secagg_leader_ms": sa_leader * 1e3, "recovery_leader_ms": drop_leader * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8_000, 1_000_000])
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--quick", action="store_true")
    add_json_flag(parser)
    args = parser.parse_args()
    stop_on_sigterm()
    sizes, groups = ((8_000,), (4,)) if args.quick else (args.sizes, args.groups)
    rows = [measure(n, g) for n in sizes for g in groups]
    cols = [("params", "params", "d"), ("group", "g", "d"), ("plain_bytes", "plain B", "d"),
            ("secagg_bytes", "secagg B", "d"), ("traffic_ratio", "traffic ×", ".3f"),
            ("plain_member_ms", "member ms plain", ".1f"), ("secagg_member_ms", "member ms secagg", ".1f"),
            ("plain_leader_ms", "leader ms plain", ".1f"), ("secagg_leader_ms", "leader ms secagg", ".1f"),
            ("recovery_leader_ms", "leader ms, 1 dropped", ".1f")]
    emit({"rows": rows}, args.json, lambda r: format_table(r["rows"], cols))


if __name__ == "__main__":
    main()
