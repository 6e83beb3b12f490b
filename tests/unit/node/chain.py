"""Builds real signed ledgers (plans, updates, results) for ledger and audit tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuflex.node.messages import PLAN, RESULT, UPDATE, make_plan
from mesh.blob import blob_hash
from mesh.codec import seal
from mesh.identity import Identity

JOB = "job0000000000001"


def make_chain(rounds: int = 3, members: int = 3, secagg: dict[int, list[dict]] | None = None,
               work: Callable[[int, int], dict] | None = None) -> tuple[list[bytes], list[Identity]]:
    """``secagg`` maps a round to the group reports its result carries. With ``work``, member
    k's update says it took ``3 + k`` local steps, and ``work(round, k)`` is what the result
    lists of its work beside it."""
    ids = [Identity(bytes([i + 1]) * 32) for i in range(members)]
    frames: list[bytes] = []
    prev, base = "", blob_hash(b"model-0")
    for r in range(1, rounds + 1):
        coord = ids[r % members]
        peers = [coord.peer_id] + [i.peer_id for i in ids if i is not coord]
        parent = {p: (None if p == coord.peer_id else coord.peer_id) for p in peers}
        plan = make_plan(coord, job=JOB, round=r, attempt=0, coordinator=coord.peer_id, base_hash=base,
                         prev_result=prev, members=peers, parent=parent, train_deadline=time.time() + 60,
                         reduce_slack_s=5.0)
        updates = []
        contributors = []
        for k, ident in enumerate(ids):
            delta_hash = blob_hash(f"delta-{r}-{k}".encode())
            updates.append(seal(ident, UPDATE, {
                "job": JOB, "round": r, "peer": ident.peer_id, "base_hash": base, "samples": 10 + k,
                "delta_hash": delta_hash, "delta_size": 4,
                "metrics": {"train_loss": 1.0 / r, **({"steps": 3 + k} if work else {})}}))
            contributors.append({"peer": ident.peer_id, "samples": 10 + k, "delta_hash": delta_hash,
                                 **(work(r, k) if work else {})})
        model = blob_hash(f"model-{r}".encode())
        frame = seal(coord, RESULT, {
            "job": JOB, "round": r, "attempt": 0, "coordinator": coord.peer_id, "prev_result": prev,
            "base_hash": base, "model_hash": model, "plan": plan, "updates": updates, "partials": [],
            "contributors": contributors, "absent": [], "metrics": {"accuracy": 0.5 + r / 10, "contributors": 3},
            "strategy": "fedavg", **({"secagg": secagg[r]} if secagg and r in secagg else {})})
        frames.append(frame)
        from mesh.codec import open_envelope

        prev, base = open_envelope(frame).digest, model
    assert PLAN
    return frames, ids
