"""Builds real signed ledgers (plans, updates, results) for ledger and audit tests.

Each round is planned by the coordinator the ranking names for attempt 0 (round 1's too, from
the members given), every update signs its plan's digest, and the result lists exactly the
signed updates: a chain that passes every evidence check (``gpuflex.node.core.evidence``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuflex.node.core.evidence import ChainRules
from gpuflex.node.core.messages import RESULT, UPDATE, Result, make_plan, parse_result
from mesh.blob import blob_hash
from mesh.codec import open_envelope, seal
from mesh.identity import Identity

JOB = "job0000000000001"
#: A key no job names: the hostile peer of evidence tests.
STRANGER = Identity(b"\x99" * 32)


def make_chain(rounds: int = 3, members: int = 3, secagg: dict[int, list[dict]] | None = None,
               work: Callable[[int, int], dict] | None = None,
               planned: int = 0) -> tuple[list[bytes], list[Identity]]:
    """``secagg`` maps a round to the group reports its result carries. With ``work``, member
    k's update says it took ``3 + k`` local steps, and ``work(round, k)`` is what the result
    lists of its work beside it. With ``planned``, each plan is time-budgeted and allows every
    member that many steps."""
    ids = [Identity(bytes([i + 1]) * 32) for i in range(members)]
    by_peer = {i.peer_id: i for i in ids}
    rules = rules_for(ids)
    frames: list[bytes] = []
    history = []
    prev, base = "", blob_hash(b"model-0")
    for r in range(1, rounds + 1):
        coord = by_peer[rules.expected_coordinator(history, 0)]
        peers = [coord.peer_id] + [i.peer_id for i in ids if i is not coord]
        parent = {p: (None if p == coord.peer_id else coord.peer_id) for p in peers}
        plan = make_plan(coord, job=JOB, round=r, attempt=0, coordinator=coord.peer_id, base_hash=base,
                         prev_result=prev, members=peers, parent=parent, train_deadline=time.time() + 60,
                         reduce_slack_s=5.0, sample_cap=0,
                         **({"budget_s": 10.0, "steps": dict.fromkeys(peers, planned)} if planned else {}))
        plan_digest = open_envelope(plan).digest
        updates = []
        contributors = []
        for k, ident in enumerate(ids):
            delta_hash = blob_hash(f"delta-{r}-{k}".encode())
            updates.append(seal(ident, UPDATE, {
                "job": JOB, "round": r, "peer": ident.peer_id, "base_hash": base, "samples": 10 + k,
                "delta_hash": delta_hash, "delta_size": 4, "plan": plan_digest,
                "metrics": {"train_loss": 1.0 / r, **({"steps": 3 + k} if work else {})}}))
            contributors.append({"peer": ident.peer_id, "samples": 10 + k, "delta_hash": delta_hash,
                                 **(work(r, k) if work else {})})
        model = blob_hash(f"model-{r}".encode())
        frame = seal(coord, RESULT, {
            "job": JOB, "round": r, "attempt": 0, "coordinator": coord.peer_id, "prev_result": prev,
            "base_hash": base, "model_hash": model, "plan": plan, "updates": updates, "partials": [],
            "contributors": contributors, "absent": [],
            "metrics": {"accuracy": 0.5 + r / 10, "contributors": len(ids)},
            "strategy": "fedavg", **({"secagg": secagg[r]} if secagg and r in secagg else {})})
        frames.append(frame)
        history.append(parse_result(open_envelope(frame, expect_kind=RESULT)))
        prev, base = history[-1].digest, model
    return frames, ids


def rules_for(ids: list[Identity], **overrides: object) -> ChainRules:
    """The rules a node of the job ``make_chain`` builds checks its ledger against."""
    fields: dict = {"job": JOB, "initial_members": tuple(sorted(i.peer_id for i in ids)), "min_nodes": 2,
                    "sample_cap_factor": 0.0}
    fields.update(overrides)
    return ChainRules(**fields)


def parsed(frames: list[bytes]) -> list[Result]:
    return [parse_result(open_envelope(f, expect_kind=RESULT)) for f in frames]


def next_round(frames: list[bytes], ids: list[Identity], *, attempt: int = 0, job: str = JOB,
               rules: ChainRules | None = None, coord: Identity | None = None,
               signers: list[Identity] | None = None, members: list[str] | None = None,
               claim: int | None = None, sample_cap: int | None = None, update_plan: str | None = None,
               samples: int = 10, model: str = "forged", model_hash: str | None = None) -> bytes:
    """A result for the round after ``frames``: by default exactly what an honest coordinator
    of ``attempt`` would sign (``rules``: the job's, ``rules_for(ids)`` if not given); each
    keyword bends one piece of its evidence. ``model_hash``: the model it commits (a blob
    peers can fetch), instead of one named after ``model`` that nobody holds."""
    history = parsed(frames)
    rules = rules or rules_for(ids)
    if sample_cap is None:
        sample_cap = rules.sample_cap(history) or 0
    if coord is None:
        owner = rules.expected_coordinator(history, attempt)
        coord = next(i for i in [*ids, STRANGER] if i.peer_id == owner)
    signers = ids if signers is None else signers
    r = len(history) + 1
    prev = history[-1].digest if history else ""
    base = history[-1].model_hash if history else blob_hash(b"model-0")
    peers = members if members is not None else [coord.peer_id, *[s.peer_id for s in signers if s is not coord]]
    if coord.peer_id not in peers:
        peers = [coord.peer_id, *peers]
    parent = {p: (None if p == coord.peer_id else coord.peer_id) for p in peers}
    plan = make_plan(coord, job=job, round=r, attempt=attempt, coordinator=coord.peer_id, base_hash=base,
                     prev_result=prev, members=peers, parent=parent, train_deadline=time.time() + 60,
                     reduce_slack_s=5.0, sample_cap=sample_cap)
    digest = update_plan or open_envelope(plan).digest
    updates, contributors = [], []
    for k, ident in enumerate(signers):
        delta = blob_hash(f"{model}-{r}-{k}".encode())
        updates.append(seal(ident, UPDATE, {
            "job": job, "round": r, "peer": ident.peer_id, "base_hash": base, "samples": samples,
            "delta_hash": delta, "delta_size": 4, "metrics": {}, "plan": digest}))
        weight = min(samples, sample_cap) if sample_cap else samples  # the result lists what counts
        contributors.append({"peer": ident.peer_id, "samples": weight, "delta_hash": delta})
    return seal(coord, RESULT, {
        "job": job, "round": r, "attempt": attempt, "coordinator": coord.peer_id, "prev_result": prev,
        "base_hash": base, "model_hash": model_hash or blob_hash(model.encode()), "plan": plan, "updates": updates,
        "partials": [], "contributors": contributors, "absent": [], "strategy": "fedavg",
        "metrics": {"accuracy": 0.999, "contributors": len(signers) if claim is None else claim}})


def private_branch(frames: list[bytes], ids: list[Identity], keys: list[Identity], upto: int, *, fork: int = 1,
                   job: str = JOB, rules: ChainRules | None = None, head_model: str | None = None) -> list[bytes]:
    """``frames[:fork]``, then rounds up to ``upto`` that count only ``keys``' updates: what one
    party holding those keys, members of round ``fork``'s plan, can commit alone in an open
    job. Its first round is on an attempt one of its keys owns; from then on only its keys are
    eligible. Every round passes every evidence check. ``head_model``: a model blob peers can
    fetch, committed by its last round, so that nothing but fork choice keeps it out."""
    rules = rules or rules_for(ids)
    branch = list(frames[:fork])
    mine = {k.peer_id for k in keys}
    owned = next(a for a in range(len(ids)) if rules.expected_coordinator(parsed(branch), a) in mine)
    while len(branch) < upto:
        last = len(branch) + 1 == upto
        branch.append(next_round(branch, ids, attempt=owned if len(branch) == fork else 0, job=job, rules=rules,
                                 signers=keys, model=f"private{len(branch) + 1}",
                                 model_hash=head_model if last else None))
    return branch
