"""The root's side of a round: apply the server optimizer and sign the round's result.

The root is the round's coordinator. With fewer than min_nodes contributions (or a masked sum
that could not be recovered) it aborts the attempt instead, saying why, and the round is
retried. The result carries its evidence: the signed plan, every signed update (inside the
partials), the previous result's hash and the new model's hash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuflex.node.collector import Reduced
from gpuflex.node.core.kinds import Phase
from gpuflex.node.core.messages import ABORT, RESULT, Plan
from gpuflex.node.core.modelblob import model_parts
from gpuflex.node.core.outerstep import outer_step
from gpuflex.node.core.pipeline import describe_rule
from gpuflex.node.core.workfields import nonce_fields
from gpuflex.node.core.workplan import effective_steps_norm, member_work
from gpuflex.node.port import JobPort, ModelLoader, Trainer
from gpuflex.node.state import JobBook
from gpuflex.privacy import epsilon_spent
from mesh.blob import blob_hash
from mesh.codec import seal

log = logging.getLogger("gpuflex.root")
#: An abort names at most this many missing members (and why each is missing).
MISSING_LISTED = 8


class Root:
    def __init__(self, port: JobPort, book: JobBook, load_model: ModelLoader,
                 trainer: Callable[[], Trainer]) -> None:
        self.port, self.book = port, book
        self._load_model, self._trainer = load_model, trainer

    async def commit(self, plan: Plan, reduced: Reduced) -> None:
        book, port, spec = self.book, self.port, self.book.spec
        book.status.set_phase(Phase.COMMIT)
        contributions = reduced.contributions
        group_reports = reduced.group_reports
        kept, need = book.ledger.rules.continuing(book.ledger.results, {u.peer for u in contributions})
        if len(contributions) < spec.min_nodes or reduced.avg is None or kept < need:
            await self._abort(plan, {u.peer for u in contributions}, group_reports)
            return
        avg = reduced.avg
        if spec.uses_fednova:  # the leaders averaged per-step directions: scale back up once
            avg = avg * np.float32(effective_steps_norm(spec, plan, contributions))
        params, state = await self._load_model(plan.base_hash, [])
        new_params, new_state, step = await port.offload(outer_step, spec, params, state, avg, plan.round)
        parts = model_parts(new_params, new_state)
        model_hash = port.blobs.put_parts(parts)
        step_hash = port.blobs.put(step) if step is not None else None
        evaluation = await port.offload(self._trainer().evaluate, new_params)
        total = sum(u.samples for u in contributions)
        train_loss = sum(u.metrics.get("train_loss", 0.0) * u.samples for u in contributions) / max(1, total)
        metrics: dict[str, Any] = {
            **{k: float(v) for k, v in evaluation.items()}, "train_loss": float(train_loss),
            "contributors": len(contributions), "samples": total,
            "duration_s": round(port.clock.since_wall(plan.issued), 3)}
        # Bytes on the wire this round: every member's encoded update, and what each member
        # that did not commit downloads to hold the model (the step, or else the model).
        work = member_work(contributions)
        metrics["update_bytes"] = sum(int(w["update_bytes"]) for w in work.values())  # type: ignore[call-overload]
        metrics["down_bytes"] = len(step) if step is not None else sum(len(p) for p in parts)
        if spec.uses_dp:
            metrics["epsilon"] = round(epsilon_spent(spec, plan.round), 4)
        if plan.prev_result != book.ledger.head:
            # While this round was reduced, the ledger moved to a branch that fork choice
            # prefers: a result for the plan's branch would extend neither, and count nowhere.
            log.info("round %d attempt %d: not committing, the ledger moved to another branch", plan.round,
                     plan.attempt)
            return
        present = {u.peer for u in contributions}
        frame = seal(port.identity, RESULT, {
            "job": book.job_id, "round": plan.round, "attempt": plan.attempt, "coordinator": book.me,
            "prev_result": book.ledger.head, "base_hash": plan.base_hash, "model_hash": model_hash,
            "plan": plan.env.raw, "updates": [u.env.raw for u in reduced.updates],
            "partials": [p.env.raw for p in reduced.partials],
            "contributors": [{"peer": u.peer, "samples": u.samples, "delta_hash": u.delta_hash, **work[u.peer],
                              **nonce_fields(u.env.body)} for u in contributions],
            "absent": sorted(set(plan.members) - present), "metrics": metrics, "strategy": spec.strategy,
            "rule": describe_rule(spec), "spec_hash": blob_hash(spec.canonical_bytes()),
            **({"step_hash": step_hash} if step_hash is not None else {}),
            **({"secagg": book.secagg_history.get(plan.round, []) + group_reports} if spec.secure_aggregation else {}),
        })
        await port.broadcast(frame)

    async def _abort(self, plan: Plan, present: set[str], group_reports: list[dict[str, Any]]) -> None:
        """Too little to commit: abort this attempt, saying why, so every node retries."""
        book, spec = self.book, self.book.spec
        if book.current.round == plan.round:
            book.current.abort(plan.attempt)
        why = "".join(f"; secure aggregation failed in the group of {r['leader'][-8:]}: {r['reason']}"
                      for r in group_reports if not r["recovered"])
        why += "".join(f"; missing {p[-8:]}: " + (f"the job failed there ({book.left[p]})" if p in book.left
                                                   else self.port.why_unreachable(p) or "no update arrived")
                       for p in sorted(set(plan.members) - present)[:MISSING_LISTED])
        kept, need = book.ledger.rules.continuing(book.ledger.results, present)
        short = f"{len(present)} contributions < min_nodes={spec.min_nodes}" if kept >= need else (
            f"{kept} of the recent rounds' contributors contributed; an open job needs {need}")
        body: dict[str, Any] = {
            "job": book.job_id, "round": plan.round, "attempt": plan.attempt, "reason": f"{short}{why}"}
        if group_reports:
            body["secagg"] = group_reports
        await self.port.broadcast(seal(self.port.identity, ABORT, body))
