"""What the committed-round checks cost per round: the checks a node ran before (signatures,
hash links, contributor list, ``min_nodes`` read from the result's own metric) against the
checks it runs now (``gpuflex.node.core.evidence.verify_round``: the plan's coordinator from the
ranking, every update made for that plan by one of its members, the sample cap, ``min_nodes``
counted from signed updates; and the canonical-encoding check on every frame), side by side
on the same real signed rounds, in one process.

Two paths are timed, each before and after:
* gossip: one result arrives and is checked as the next round;
* catch-up sync: a ledger of ``rounds`` rounds is checked from round 1.

``round_overhead --checks`` prints this table next to a real mesh's round overhead measured
in the same run, so the checks' share of a round can be read off directly.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import format_table, ratio


def signed_chain(members: int, rounds: int) -> tuple[list[bytes], Any]:
    """A real ledger: ``rounds`` rounds, each planned by its attempt-0 coordinator and counting
    every member's signed update (what ``verify_round`` accepts)."""
    from gpuflex.node.core.evidence import ChainRules
    from gpuflex.node.core.messages import RESULT, UPDATE, make_plan, parse_result
    from mesh.blob import blob_hash
    from mesh.codec import open_envelope, seal
    from mesh.identity import Identity

    job = "benchchecks00001"
    ids = [Identity(i.to_bytes(4, "big") * 8) for i in range(1, members + 1)]
    by_peer = {i.peer_id: i for i in ids}
    rules = ChainRules(job=job, initial_members=tuple(sorted(by_peer)), min_nodes=members, sample_cap_factor=4.0)
    frames: list[bytes] = []
    history: list[Any] = []
    prev, base = "", blob_hash(b"model-0")
    for r in range(1, rounds + 1):
        coord = by_peer[rules.expected_coordinator(history, 0)]
        peers = [coord.peer_id, *[i.peer_id for i in ids if i is not coord]]
        parent = {p: (None if p == coord.peer_id else coord.peer_id) for p in peers}
        cap = rules.sample_cap(history) or 0
        plan = make_plan(coord, job=job, round=r, attempt=0, coordinator=coord.peer_id, base_hash=base,
                         prev_result=prev, members=peers, parent=parent, train_deadline=time.time() + 60,
                         reduce_slack_s=5.0, sample_cap=cap)
        digest = open_envelope(plan).digest
        updates, contributors = [], []
        for k, ident in enumerate(ids):
            delta = blob_hash(f"{r}-{k}".encode())
            updates.append(seal(ident, UPDATE, {
                "job": job, "round": r, "peer": ident.peer_id, "base_hash": base, "samples": 100,
                "delta_hash": delta, "delta_size": 1000, "metrics": {"seconds": 0.1}, "plan": digest}))
            contributors.append({"peer": ident.peer_id, "samples": 100, "delta_hash": delta})
        model = blob_hash(f"model-{r}".encode())
        frame = seal(coord, RESULT, {
            "job": job, "round": r, "attempt": 0, "coordinator": coord.peer_id, "prev_result": prev,
            "base_hash": base, "model_hash": model, "plan": plan, "updates": updates, "partials": [],
            "contributors": contributors, "absent": [], "strategy": "fedavg",
            "metrics": {"accuracy": 0.5, "contributors": members}})
        frames.append(frame)
        history.append(parse_result(open_envelope(frame, expect_kind=RESULT)))
        prev, base = history[-1].digest, model
    return frames, rules


def check_before(frames: list[bytes], job: str, min_nodes: int) -> None:
    """The checks a node ran on each round before committed rounds carried their evidence."""
    from gpuflex.node.core.messages import (
        PLAN,
        RESULT,
        parse_plan,
        parse_result,
        walk_contributions,
    )
    from mesh.codec import open_envelope

    prev = ""
    for i, frame in enumerate(frames, start=1):
        res = parse_result(open_envelope(frame, expect_kind=RESULT))
        plan = parse_plan(open_envelope(res.plan_frame, expect_kind=PLAN))
        counted = walk_contributions(res.updates, res.partials, res.job, res.round)
        ok = (res.job == job and res.round == i and res.prev_result == prev and plan.coordinator == res.coordinator
              and plan.round == res.round and plan.base_hash == res.base_hash
              and sorted((c["peer"], c["samples"], c["delta_hash"]) for c in res.contributors)
              == sorted((u.peer, u.samples, u.delta_hash) for u in counted)
              and res.metrics.get("contributors", 0) >= min_nodes)
        if not ok:
            raise AssertionError(f"round {i} fails the old checks")
        prev = res.digest


def check_after(frames: list[bytes], rules: Any) -> None:
    """Today's checks: ``verify_chain`` with the job's rules (``evidence.verify_round`` per round)."""
    from gpuflex.node.core.ledger import verify_chain

    verify_chain(frames, rules.job, rules)


def paired_ms(before: Callable[[], None], after: Callable[[], None], budget_s: float = 1.5) -> tuple[float, float]:
    """Median CPU milliseconds of ``before`` and ``after``, run alternately within about
    ``budget_s``. CPU time of this process, not wall time: on a shared machine a wall clock
    measures the scheduler, and alternating keeps both sides under the same conditions."""
    times: tuple[list[float], list[float]] = ([], [])
    deadline = time.perf_counter() + budget_s
    while len(times[0]) < 7 or (time.perf_counter() < deadline and len(times[0]) < 300):
        for side, fn in enumerate((before, after)):
            t0 = time.process_time()
            fn()
            times[side].append(time.process_time() - t0)
    return statistics.median(times[0]) * 1000, statistics.median(times[1]) * 1000


def measure(members: int, rounds: int) -> dict[str, Any]:
    from gpuflex.node.core.messages import RESULT, parse_result
    from mesh.codec import canonical_frame, open_envelope

    frames, rules = signed_chain(members, rounds)
    job = rules.job
    history = [parse_result(open_envelope(f, expect_kind=RESULT)) for f in frames[:-1]]

    def gossip_before() -> None:  # the one new round, checked as the next after a verified ledger
        _one_before(frames[-1], history, job, rules.min_nodes)

    def gossip_after() -> None:
        from gpuflex.node.core.evidence import verify_round

        verify_round(parse_result(open_envelope(frames[-1], expect_kind=RESULT)), history, rules)

    # The canonical-encoding check (one re-pack per frame) runs inside open_envelope in both
    # columns; the code before had none, so its cost is taken out of "before".
    round_pairs = frame_pairs(frames[-1])
    repack, _ = paired_ms(lambda: [canonical_frame(h, s) for h, s in round_pairs], lambda: None, 0.3)
    row: dict[str, Any] = {"members": members, "rounds": rounds, "canonical_us": repack * 1000 / len(round_pairs)}
    before, after = paired_ms(gossip_before, gossip_after)
    row["gossip_before_ms"], row["gossip_after_ms"] = before - repack, after
    before, after = paired_ms(lambda: check_before(frames, job, rules.min_nodes), lambda: check_after(frames, rules))
    row["sync_before_ms"], row["sync_after_ms"] = before - repack * rounds, after
    row["gossip_ratio"] = ratio(row["gossip_after_ms"], row["gossip_before_ms"])
    row["sync_ratio"] = ratio(row["sync_after_ms"], row["sync_before_ms"])
    return row


def _one_before(frame: bytes, history: list[Any], job: str, min_nodes: int) -> None:
    from gpuflex.node.core.messages import (
        PLAN,
        RESULT,
        parse_plan,
        parse_result,
        walk_contributions,
    )
    from mesh.codec import open_envelope

    res = parse_result(open_envelope(frame, expect_kind=RESULT))
    plan = parse_plan(open_envelope(res.plan_frame, expect_kind=PLAN))
    counted = walk_contributions(res.updates, res.partials, res.job, res.round)
    if res.prev_result != history[-1].digest or plan.coordinator != res.coordinator or len(counted) < min_nodes:
        raise AssertionError("the round fails the old checks")


def frame_pairs(result_frame: bytes) -> list[tuple[bytes, bytes]]:
    """(header, signature) of every frame one round carries: the result, its plan, its updates."""
    import msgpack

    from gpuflex.node.core.messages import RESULT, parse_result
    from mesh.codec import open_envelope

    res = parse_result(open_envelope(result_frame, expect_kind=RESULT))
    return [tuple(msgpack.unpackb(f, raw=False)) for f in (result_frame, res.plan_frame, *res.updates)]


def run(sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    return [measure(n, rounds) for n in sizes]


def render(rows: list[dict[str, Any]]) -> str:
    columns = [("members", "contributors", "d"), ("gossip_before_ms", "one result before ms", ".2f"),
               ("gossip_after_ms", "after ms", ".2f"), ("gossip_ratio", "after/before", ".2f"),
               ("canonical_us", "canonical check µs/frame", ".1f"), ("rounds", "ledger rounds", "d"),
               ("sync_before_ms", "whole ledger before ms", ".1f"),
               ("sync_after_ms", "after ms", ".1f"), ("sync_ratio", "after/before", ".2f")]
    return "\n".join([
        "Committed-round checks per round, before (signatures, links, contributor list, min_nodes from the "
        "result's metric) and after (evidence: coordinator of the attempt, updates made for the plan, sample "
        "cap, min_nodes from signed updates, canonical frames); same signed rounds, one process, median CPU ms, "
        "before and after run alternately",
        format_table(rows, columns)])
