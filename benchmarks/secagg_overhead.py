"""Secure-aggregation overhead in bytes and time against plain FedAvg, and the cost of the
dropout-recovery round trip.

One group: a leader and g masking members, a float32 model of N parameters. Plain FedAvg
sends N float32 per member and the leader folds them into a running mean; secure aggregation
sends N uint32 (masked, same size) plus the encrypted Shamir shares of the pairwise seeds,
and the leader sums in the ring and unmasks the sum. Times are per member (encode: quantise,
g - 1 mask expansions, shares) and for the leader (decode + reduce + unmask). All in one
process, so no transport cost is counted: the byte counts are what the wire carries.

With one member dropped after masking, the leader also runs the recovery round trip: a signed
request to each survivor, a signed answer back (the same code the round driver runs, with the
transport replaced by a direct call), then it rebuilds the dangling seeds and unmasks. The
table gives its bytes (all requests and answers), the group's traffic ratio including them,
and its time. A second table times the same round trip over real libp2p hosts on loopback
(one process), where the survivors answer in parallel, side by side with the same number of
same-size requests to a handler that does nothing: the ratio is what recovery adds to the bare
message exchange. The exchange does not depend on N, only on g.

Run:

    python -m benchmarks.secagg_overhead [--sizes 100000 1000000] [--groups 4 8] [--wire-groups 4]
        [--reps 5] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import trio

from benchmarks.common import (
    Stopwatch,
    add_json_flag,
    await_until,
    emit,
    format_table,
    log,
    stop_on_sigterm,
)

SAMPLES = 100
ECHO_KIND = "secagg_bench_echo"
#: Co-hosted nodes settle (discovery, node info) before the timed round trips start.
SETTLE_S = 3.0


@dataclass
class Group:
    """One group's state after the members' updates reached the leader."""

    red: Any  # the leader's reducer
    sides: dict[str, Any]  # each sending member's masking side (None under plain FedAvg)
    payload_bytes: int
    member_s: float
    leader_s: float


def build_group(spec: Any, ids: list[Any], deltas: list[np.ndarray], round_: int = 1, drop: int = 0) -> Group:
    """ids[0] leads; the first ``drop`` members train and mask, but never send."""
    from gpuflex.node.core.pipeline import DeltaEncoder, decode_update, make_reducer, secagg_member

    leader = ids[0].peer_id
    plan = SimpleNamespace(job="bench", round=round_, attempt=0,
                           parent={i.peer_id: (None if i.peer_id == leader else leader) for i in ids})
    enc = DeltaEncoder(spec)
    payloads, sides = [], {}
    with Stopwatch() as member:
        for ident, delta in zip(ids[1:], deltas, strict=True):
            side = secagg_member(spec, ident, plan)
            payload = enc.encode(delta, SAMPLES, side)
            if len(sides) >= drop or side is None:
                payloads.append((ident.peer_id, payload))
            sides[ident.peer_id] = side
    red = make_reducer(spec, True, plan=plan, me=leader)
    size = deltas[0].size
    with Stopwatch() as lead:
        for peer, payload in payloads:
            red.add(decode_update(spec, payload, size), float(SAMPLES), peer)
    return Group(red, sides, len(payloads[0][1]), member.seconds / len(ids[1:]), lead.seconds)


def direct_request(ids: list[Any], sides: dict[str, Any], sent: list[int]) -> Any:
    """The survivors' side of the exchange without a transport; counts the bytes both ways."""
    from gpuflex.node.core.messages import SECAGG_RECOVER, parse_recovery_request
    from gpuflex.node.core.secure import answer_recovery
    from mesh.codec import open_envelope

    by_id = {i.peer_id: i for i in ids}

    async def request(holder: str, frame: bytes) -> bytes:
        req = parse_recovery_request(open_envelope(frame, expect_kind=SECAGG_RECOVER))
        reply = answer_recovery(by_id[holder], sides[holder], req)
        sent.append(len(frame) + len(reply))
        return reply

    return request


def measure(size: int, members: int) -> dict[str, Any]:
    from gpuflex.jobspec import JobSpec
    from gpuflex.node.recovery import collect_answers
    from mesh.identity import Identity

    plain_spec = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits"})
    sa_spec = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "secure_aggregation": True})
    ids = [Identity(bytes([i + 1]) * 32) for i in range(members + 1)]
    rng = np.random.default_rng(0)
    deltas = [rng.normal(0, 0.05, size).astype(np.float32) for _ in ids[1:]]

    def unmask(group: Group) -> float:
        with Stopwatch() as sw:
            group.red.result()
        return group.leader_s + sw.seconds

    plain = build_group(plain_spec, ids, deltas)
    plain_leader = unmask(plain)
    sa = build_group(sa_spec, ids, deltas)
    sa_leader = unmask(sa)
    dropped = build_group(sa_spec, ids, deltas, drop=1)
    sent: list[int] = []

    async def recover() -> float:
        with Stopwatch() as sw:
            problems = await collect_answers(ids[0], dropped.red, direct_request(ids, dropped.sides, sent), 60.0)
            dropped.red.result()
        assert not problems, problems
        return sw.seconds

    recovery_s = trio.run(recover)
    survivors = members - 1
    return {"params": size, "group": members, "plain_bytes": plain.payload_bytes, "secagg_bytes": sa.payload_bytes,
            "traffic_ratio": sa.payload_bytes / plain.payload_bytes, "plain_member_ms": plain.member_s * 1e3,
            "secagg_member_ms": sa.member_s * 1e3, "plain_leader_ms": plain_leader * 1e3,
            "secagg_leader_ms": sa_leader * 1e3, "recovery_bytes": sum(sent),
            "recovery_traffic_ratio": (survivors * sa.payload_bytes + sum(sent)) / (survivors * plain.payload_bytes),
            "recovery_ms": recovery_s * 1e3, "recovery_leader_ms": (dropped.leader_s + recovery_s) * 1e3}


async def wire_round_trip(members: int, reps: int) -> dict[str, Any]:
    """The recovery exchange between real hosts on loopback: the leader asks every survivor
    at once (``collect_answers``, as the round driver does); median wall time over ``reps``
    fresh groups, each with one member dropped. Interleaved with it, the baseline: the same
    number of concurrent direct requests of the same sizes to a handler that does nothing."""
    from gpuflex.jobspec import JobSpec
    from gpuflex.node.core.messages import SECAGG_RECOVER, parse_recovery_request
    from gpuflex.node.core.secure import answer_recovery
    from gpuflex.node.recovery import collect_answers
    from mesh.codec import register_kind, seal
    from mesh.health import HealthConfig
    from mesh.identity import Identity
    from mesh.messaging import SendError
    from mesh.node import MeshConfig, MeshNode

    register_kind(ECHO_KIND, 64 * 1024)
    # Pings between co-hosted nodes would only compete with the exchange for the one process.
    health = HealthConfig(ping_interval_s=30.0, ping_timeout_s=5.0, suspect_after_s=90.0, down_after_s=180.0)
    spec = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "secure_aggregation": True})
    current: dict[str, Any] = {}
    times: list[float] = []
    echo_times: list[float] = []
    sizes: list[int] = []
    with tempfile.TemporaryDirectory(prefix="secagg-bench-") as scratch:
        async with contextlib.AsyncExitStack() as stack:
            nodes: list[Any] = []
            for i in range(members + 1):
                boot = nodes[0].multiaddrs()[:1] if nodes else []
                config = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=boot, health=health,
                                    data_dir=Path(scratch) / f"node{i}")
                node = await stack.enter_async_context(MeshNode.start(Identity.generate(), config))

                async def answer(msg: Any, node: Any = node) -> bytes:
                    req = parse_recovery_request(msg.envelope)
                    return answer_recovery(node.identity, current[node.peer_id], req)

                async def echo(msg: Any) -> bytes:
                    return bytes(msg.envelope.body["reply"])

                node.handlers.register(SECAGG_RECOVER, answer)
                node.handlers.register(ECHO_KIND, echo)
                nodes.append(node)
            leader, ids = nodes[0], [n.identity for n in nodes]
            everyone = {n.peer_id for n in nodes[1:]}
            def all_connected() -> bool:
                return everyone <= {str(p) for p in leader.host.get_connected_peers()}

            if not await await_until(all_connected, 60.0, 0.2):
                raise RuntimeError("the loopback hosts did not connect to the leader within 60s")
            await trio.sleep(SETTLE_S)
            deltas = [np.zeros(1000, np.float32) for _ in ids[1:]]
            exchanged: list[tuple[str, int, int]] = []

            async def request(holder: str, frame: bytes) -> object:
                reply = await leader.request(holder, frame, timeout=10.0)
                exchanged.append((holder, len(frame), len(reply)))
                return reply

            async def baseline() -> bool:
                lost: list[str] = []

                async def one(holder: str, frame: bytes) -> None:
                    try:
                        await leader.request(holder, frame, timeout=10.0)
                    except SendError:
                        lost.append(holder)

                async with trio.open_nursery() as nursery:
                    for holder, out, back in exchanged:
                        echo = seal(leader.identity, ECHO_KIND, {"pad": bytes(out), "reply": back})
                        nursery.start_soon(one, holder, echo)
                return not lost

            failed = 0
            for rep in range(reps + 1):  # the first one opens the streams: not timed
                group = build_group(spec, ids, deltas, round_=rep + 1, drop=1)
                current.update(group.sides)
                exchanged.clear()
                with Stopwatch() as sw:
                    problems = await collect_answers(leader.identity, group.red, request, 30.0)
                if problems:  # an overloaded host drops a stream now and then: count it, do not time it
                    failed += 1
                    log(f"g={members}: recovery round trip {rep} lost {len(problems)} answer(s): {problems}")
                    continue
                group.red.result()
                sizes = [out + back for _, out, back in exchanged]
                with Stopwatch() as echo_sw:
                    echoed = await baseline()
                if not echoed:
                    failed += 1
                    log(f"g={members}: a baseline request of run {rep} was lost")
                elif rep:
                    times.append(sw.seconds)
                    echo_times.append(echo_sw.seconds)
            if not times:
                raise RuntimeError(f"no recovery round trip of g={members} completed")
            for node in nodes:
                node.stop()
    median, echo_median = statistics.median(times), statistics.median(echo_times)
    return {"group": members, "survivors": members - 1, "recovery_bytes": sum(sizes), "timed": len(times),
            "failed": failed, "loopback_ms": median * 1e3, "echo_ms": echo_median * 1e3,
            "vs_echo": median / echo_median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8_000, 1_000_000])
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--wire-groups", type=int, nargs="+", default=[4],
                        help="group sizes for the loopback round trip (g + 1 py-libp2p hosts in one process)")
    parser.add_argument("--reps", type=int, default=5, help="timed loopback round trips per group size")
    parser.add_argument("--quick", action="store_true")
    add_json_flag(parser)
    args = parser.parse_args()
    stop_on_sigterm()
    sizes, groups, reps = ((8_000,), (4,), 2) if args.quick else (args.sizes, args.groups, args.reps)
    rows = [measure(n, g) for n in sizes for g in groups]
    wire = [trio.run(wire_round_trip, g, reps) for g in ([4] if args.quick else args.wire_groups)]
    cols = [("params", "params", "d"), ("group", "g", "d"), ("plain_bytes", "plain B", "d"),
            ("secagg_bytes", "secagg B", "d"), ("traffic_ratio", "traffic ×", ".3f"),
            ("plain_member_ms", "member ms plain", ".1f"), ("secagg_member_ms", "member ms secagg", ".1f"),
            ("plain_leader_ms", "leader ms plain", ".1f"), ("secagg_leader_ms", "leader ms secagg", ".1f"),
            ("recovery_bytes", "recovery B", "d"), ("recovery_traffic_ratio", "traffic ×, 1 dropped", ".3f"),
            ("recovery_ms", "recovery ms", ".1f"), ("recovery_leader_ms", "leader ms, 1 dropped", ".1f")]
    wire_cols = [("group", "g", "d"), ("survivors", "survivors", "d"), ("recovery_bytes", "recovery B", "d"),
                 ("timed", "runs", "d"), ("failed", "lost", "d"),
                 ("loopback_ms", "recovery round trip ms", ".1f"), ("echo_ms", "same-size no-op requests ms", ".1f"),
                 ("vs_echo", "×", ".2f")]
    emit({"rows": rows, "loopback": wire}, args.json,
         lambda r: format_table(r["rows"], cols) + "\n\nRecovery round trip over libp2p on loopback, 1 dropped:\n"
         + format_table(r["loopback"], wire_cols))


if __name__ == "__main__":
    main()
