"""The coordinator's side of a round: obtain the plan, and make it when this node ranks first.

Every node computes the same coordinator ranking for round r (``ranking.coordinator_ranking``).
The first live candidate signs and gossips a plan; each backup waits one plan timeout per live
candidate ranked above it before taking over. A received plan is accepted only if it extends
this node's ledger, comes from a member, and beats any plan already in force (a later attempt,
or the same attempt from a better-ranked coordinator).
"""

from __future__ import annotations

import math

import trio

from aggregation.tree import build_tree
from gpuflex.node.kinds import EventKind, Phase
from gpuflex.node.messages import Plan, make_plan, parse_plan
from gpuflex.node.placement import order_for_tree
from gpuflex.node.port import JobPort
from gpuflex.node.ranking import coordinator_ranking
from gpuflex.node.state import JobBook, RoundDeadlines, RoundState
from gpuflex.node.workplan import keep_earlier, plan_steps
from mesh.codec import WireError
from mesh.health import PeerState
from mesh.messaging import Inbound, Rejected

#: A coordinator waits this long for min_nodes members to be reachable before giving up its turn.
MIN_NODES_WAIT_S = 60.0
#: A plan that arrives before this node has prepared the job waits this long for it.
READY_WAIT_S = 30.0
#: A plan may arrive while the previous round's result is still being applied here (a model
#: download): it waits this long for the ledger to catch up.
PREVIOUS_ROUND_WAIT_S = 15.0


class Coordinator:
    def __init__(self, port: JobPort, book: JobBook) -> None:
        self.port, self.book = port, book

    def ranking(self, round_: int, attempt: int) -> list[str]:
        book = self.book
        return coordinator_ranking(book.job_id, round_, book.eligible(), book.recent_coordinators(), attempt,
                                   private=self.port.private_peers())

    async def obtain_plan(self, rs: RoundState) -> Plan | None:
        """The plan in force for ``rs.attempt`` or later: this node's own if it ranks first
        among the live candidates, else the one a candidate sends before its turn passes."""
        book, clock = self.book, self.port.clock
        start = clock.now()
        waited = 0

        def have_plan() -> bool:
            return rs.plan is not None and rs.plan.attempt >= rs.attempt

        for cand in self.ranking(rs.round, rs.attempt):
            if have_plan():
                return rs.plan
            if cand == book.me:
                if book.participates():
                    return await self.coordinate(rs)
                continue
            if self.port.health(cand) in (None, PeerState.DOWN):
                continue
            waited += 1
            until = start + waited * book.spec.plan_timeout
            await book.changed.wait_for(lambda: have_plan() or book.committed >= rs.round, until)
        return rs.plan

    async def coordinate(self, rs: RoundState) -> Plan | None:
        """Make and gossip the plan for ``rs``: wait (bounded) for min_nodes live members."""
        book, port = self.book, self.port
        spec = book.spec
        until = port.clock.now() + MIN_NODES_WAIT_S

        def members() -> list[str]:
            return book.live_members(port.alive_peers())

        book.status.set_phase(Phase.PLAN)
        await book.changed.wait_for(
            lambda: len(members()) >= spec.min_nodes or book.committed >= rs.round, until)
        if book.committed >= rs.round:  # caught up from peers while waiting
            return None
        live = members()
        if len(live) < spec.min_nodes:
            port.emit(EventKind.ROUND_WAITING, rs.round, message=(
                f"round {rs.round}: only {len(live)} of min_nodes={spec.min_nodes} members reachable; not planning"))
            return None
        ordered, group_size = order_for_tree(book.me, live, port.private_peers(), spec.group_size)
        flat = spec.aggregation_mode == "flat-robust"  # leaders only forward: the root sees all
        parent = build_tree(ordered, max(2, len(ordered)) if flat else group_size, book.me)
        train_by = port.clock.now() + spec.train_budget(book.recent_durations())
        work: dict[str, object] = {}
        if spec.uses_budget:  # each member's steps from its published throughput
            counts = plan_steps(ordered, book.rates, spec.compute_budget_s, spec.batch_size, spec.local_steps)
            earlier = [c.plan for c in rs.collectors.values()] + ([rs.plan] if rs.plan is not None else [])
            work = {"budget_s": spec.compute_budget_s,
                    "steps": keep_earlier(counts, [p for p in earlier if p.round == rs.round], book.head_model)}
        frame = make_plan(
            port.identity, job=book.job_id, round=rs.round, attempt=rs.attempt, coordinator=book.me,
            base_hash=book.head_model, prev_result=book.ledger.head, members=ordered, parent=parent,
            train_deadline=port.clock.to_wire(train_by), reduce_slack_s=spec.reduce_slack, **work,
        )
        await port.broadcast(frame)  # applied here first: it is in force unless a better one is
        return rs.plan

    async def accept(self, msg: Inbound) -> tuple[Plan, RoundDeadlines]:
        """Check a received plan and make it the one in force; Rejected or WireError if not."""
        book = self.book
        plan = parse_plan(msg.envelope)
        with trio.move_on_after(READY_WAIT_S):
            await book.ready.wait()
        # The previous round's result may still be being applied here (model download).
        await book.changed.wait_for(lambda: book.committed >= plan.round - 1,
                                    self.port.clock.now() + PREVIOUS_ROUND_WAIT_S)
        r = book.current.round
        if plan.round != r or plan.prev_result != book.ledger.head or plan.base_hash != book.head_model:
            raise Rejected(f"plan for round {plan.round} does not extend this node's ledger at round {r - 1}")
        if plan.coordinator not in set(book.eligible()) | {book.me}:
            raise WireError("round", f"plan from {plan.coordinator[-8:]}, who is not a member of this job")
        rs = book.current
        current = rs.plan
        if current is not None:
            if plan.attempt < current.attempt:
                raise Rejected("plan for an older attempt")
            if plan.attempt == current.attempt:
                rank = {p: i for i, p in enumerate(self.ranking(r, plan.attempt))}
                if rank.get(plan.coordinator, math.inf) >= rank.get(current.coordinator, math.inf):
                    raise Rejected("a plan from a better-ranked coordinator is already in force")
        deadlines = RoundDeadlines(train=self.port.clock.to_local(plan.train_deadline),
                                   slack=plan.reduce_slack_s, members=len(plan.members))
        rs.plan, rs.deadlines = plan, deadlines
        self.port.emit(EventKind.PLAN_RECEIVED, r, plan.coordinator, message=(
            f"round {r}: plan from {plan.coordinator[-8:]} with {len(plan.members)} members"))
        book.changed.notify()
        return plan, deadlines
