"""One job on one node: prepare it, sequence its rounds through the roles, route its messages.

For round r the driver asks the coordinator role for the plan, then waits for the round to
commit; a plan in force starts this node's roles in it (member, and leader or root when it
has children). An attempt that cannot commit (aborted, its deadline passed, its coordinator
down) is retried with the next attempt's ranking, from the same base: members re-send the
update they already computed, so accepted work is not lost.

The driver holds the job's state (``JobBook``) and its ``JobPort``; it never reaches into its
owner, and its owner only calls its methods.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from aggregation.tree import children
from gpuflex.node.collector import Collector
from gpuflex.node.core.kinds import EventKind, JobState, Phase, Role
from gpuflex.node.core.ledger import HEAD_CHARS, ChainCheck, LedgerClaim
from gpuflex.node.core.messages import (
    ABORT,
    EMPTY,
    PARTIAL,
    PLAN,
    RESULT,
    SECAGG_RECOVER,
    TAKEN,
    UPDATE,
    MessageKind,
    Plan,
)
from gpuflex.node.core.pipeline import RESIDUAL_FILE, DeltaEncoder
from gpuflex.node.export import JobExport, job_export
from gpuflex.node.faults import NO_FAULTS, Faults
from gpuflex.node.models import Models
from gpuflex.node.policy import IncidentPolicy
from gpuflex.node.port import JobPort, Trainer, TrainerFactory
from gpuflex.node.prepare import Preparation, load_trainer
from gpuflex.node.presence import FAILED_REASON_CHARS, JobPresence
from gpuflex.node.quorum import QuorumWatch
from gpuflex.node.roles.apply import ResultApplier
from gpuflex.node.roles.coordinator import Coordinator
from gpuflex.node.roles.leader import Leader
from gpuflex.node.roles.member import Member
from gpuflex.node.roles.plansahead import PlanAhead, PlansAhead
from gpuflex.node.roles.root import Root
from gpuflex.node.state import JobBook, JobInfo, RoundDeadlines, RoundState
from gpuflex.node.summary import ledger_rows, members_gone_note, metric_rows, summarize
from gpuflex.privacy import STOP, WARN, budget_status
from gpuflex.safetext import without_paths
from mesh.codec import WireError, WireReason
from mesh.health import PeerState
from mesh.messaging import Inbound, Rejected, SendError

log = logging.getLogger("gpuflex.rounds")
#: A fresh plan's coordinator is not declared dead for this long: its health record may lag.
COORDINATOR_GRACE_S = 2.0
#: An attempt that ends at once (no plan, no live coordinator) is retried no sooner than this,
#: so no path through the round loop can spin without yielding.
ATTEMPT_MIN_S = 1.0
#: While every member is gone the job waits for a change (a peer's health, a presence, a plan);
#: it also looks again this often.
MEMBERS_GONE_RECHECK_S = 60.0
#: An update or partial that arrives before this node has prepared the job waits this long.
PAYLOAD_READY_WAIT_S = 10.0


class JobDriver:
    def __init__(self, info: JobInfo, port: JobPort, jobs_dir: Path, *, faults: Faults = NO_FAULTS,
                 trainers: TrainerFactory = load_trainer) -> None:
        self.port, self.faults = port, faults
        self.book = book = JobBook(info, port.identity.peer_id, jobs_dir / info.job_id)
        self.job_id, self.spec = info.job_id, info.spec
        self.preparation = Preparation(port, book, trainers, faults)
        self._members_gone = False  # waiting, at no cost, for any member to come back
        incidents = IncidentPolicy(port, book.status, info.job_id)
        self.models = Models(port, book)
        self.coordinator = Coordinator(port, book, own_samples=self._own_samples, start_roles=self._start_roles)
        self.leader = Leader(port, book, incidents)
        self.member = Member(port, book, DeltaEncoder(info.spec, residual_path=book.dir / RESIDUAL_FILE), faults,
                             self.models.load, self.trainer, fold_own=self.leader.fold_own)
        self.root = Root(port, book, self.models.load, self.trainer)
        self.applier = ResultApplier(port, book, self.models, incidents)
        self.plans_ahead = PlansAhead(book, incidents, self.coordinator.accept, self._start_roles)
        self.quorum = QuorumWatch(book, port)
        self._handlers: dict[str, Callable[[Inbound], Awaitable[Any]]] = {
            PLAN: self.on_plan, UPDATE: self.leader.on_update, PARTIAL: self.leader.on_partial,
            RESULT: self.applier.on_result, ABORT: self.applier.on_abort,
            SECAGG_RECOVER: self.member.on_secagg_recover, TAKEN: self.leader.on_taken, EMPTY: self.leader.on_empty}

    #: The message kinds a job handles (the job manager routes them here by the body's job id).
    HANDLED: tuple[MessageKind, ...] = (PLAN, UPDATE, PARTIAL, RESULT, ABORT, SECAGG_RECOVER, TAKEN, EMPTY)
    #: The kinds that carry a payload (a delta), as large as the job's model allows.
    WITH_PAYLOAD: tuple[MessageKind, ...] = (UPDATE, PARTIAL)

    def _own_samples(self) -> int:
        trainer = self.preparation.trainer
        return trainer.num_samples if trainer is not None else 0

    def trainer(self) -> Trainer:
        if self.preparation.trainer is None:
            raise RuntimeError("the job's workload is not prepared yet")
        return self.preparation.trainer

    async def handle(self, msg: Inbound) -> Any:
        """Route one of this job's messages to the role that handles its kind."""
        handler = self._handlers.get(msg.envelope.kind)
        if handler is None:
            raise WireError(WireReason.KIND, f"a job does not handle {msg.envelope.kind} messages")
        return await handler(msg)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def run(self) -> None:
        book, status = self.book, self.book.status
        async with trio.open_nursery() as nursery:
            book.tasks.nursery = nursery
            try:
                await self.preparation.run()
                status.start()
                while book.committed < self.spec.rounds and self._budget_allows():
                    await self._rest(book.current)
                    await self._drive_round(book.current)
                status.finish()
                last = book.ledger.results[-1].metrics if book.ledger.results else {}
                self.port.emit(EventKind.JOB_DONE, book.committed, message=(
                    f"job {self.job_id} done after {book.committed} rounds: "
                    f"accuracy {last.get('accuracy', float('nan')):.3f}"))
                book.changed.notify()
            except Exception as exc:  # a local failure (data, model, disk) ends this job, not the node
                status.fail(str(exc))
                log.exception("job %s failed", self.job_id)
                self.port.emit(EventKind.JOB_FAILED, message=f"job {self.job_id} failed: {exc}")
                nursery.cancel_scope.cancel()
                return
            # Done: the last round's tasks end by themselves; the job keeps serving its messages
            # (a competing result still triggers fork choice, a peer still gets recovery answers).
            await trio.sleep_forever()

    def _budget_allows(self) -> bool:
        """False once the next round would spend more privacy than the job allows."""
        done, spec = self.book.committed, self.spec
        budget = budget_status(spec, done)
        if budget == STOP:
            self.port.emit(EventKind.PRIVACY_BUDGET, done, message=(
                f"job {self.job_id}: stopping, round {done + 1} would exceed ε={spec.dp_epsilon_budget:g}"))
            return False
        if budget == WARN:
            self.port.emit(EventKind.PRIVACY_BUDGET, done, message=(
                f"job {self.job_id}: privacy budget ε={spec.dp_epsilon_budget:g} exceeded"))
        return True

    # -- one round -----------------------------------------------------------------------------------

    async def _rest(self, rs: RoundState) -> None:
        """The job's ``pause_s`` after a commit, on trio's clock, before this node takes up the
        next round: the machine is idle meanwhile. A plan or a commit of that round arriving
        from a peer that rested less ends it, so nodes never wait on each other's rests."""
        pause = self.spec.pause_s
        if pause <= 0 or self.book.committed == 0:
            return
        await self.book.changed.wait_for(lambda: self._moved_on(rs), self.port.clock.now() + pause)

    async def _drive_round(self, rs: RoundState) -> None:
        """Attempts of round ``rs.round`` until it commits. Every pass through the loop waits
        on something (a plan, a commit, a change, or at least ``ATTEMPT_MIN_S``), so a round
        that cannot progress costs no CPU and the node keeps serving."""
        book, status, clock = self.book, self.book.status, self.port.clock
        rs.begin_attempt(rs.plan.attempt if rs.plan is not None else 0)
        if self.coordinator.turns.passes_own_turns() or book.committed > 0:
            # Peers skip its turns on its word; a new round's coordinators hear it now, not at its
            # next period (``Coordinator._unheard``: in a large mesh they may know nothing of it).
            self.port.announce_soon()
        while not book.round_over(rs):
            began = clock.now()
            status.set_phase(Phase.PLAN)
            status.set_role(Role.IDLE)
            try:
                plan = await self.coordinator.obtain_plan(rs)
            except (WireError, Rejected, SendError) as exc:  # a message or race ends one attempt, not the job
                log.warning("job %s round %d attempt %d: %s", self.job_id, rs.round, rs.attempt, exc)
                plan = None
            if book.round_over(rs):
                return
            if plan is not None and plan.attempt < rs.attempt:
                plan = None  # only the failed attempt's plan is in force: nobody planned this one
            if plan is None:
                if self.anyone_to_plan():
                    rs.begin_attempt(rs.attempt + 1)
                else:
                    await self._wait_for_members(rs)
            else:
                reason = await self._await_commit(rs, plan)
                if reason is None:
                    return
                latest = rs.plan
                rs.begin_attempt(max(plan.attempt, latest.attempt if latest else 0) + 1)
                self.port.emit(EventKind.ROUND_RETRIED, rs.round, message=(
                    f"round {rs.round} attempt {plan.attempt} did not commit ({reason}); "
                    f"retrying as attempt {rs.attempt}"))
            await book.changed.wait_for(lambda: self._moved_on(rs), began + ATTEMPT_MIN_S)

    def _moved_on(self, rs: RoundState) -> bool:
        """The round committed, or a plan for the attempt now due arrived."""
        return self.book.round_over(rs) or rs.has_plan()

    def anyone_to_plan(self) -> bool:
        """Whether any member could plan a round now: this node, if it takes part and is a
        member, or a member whose health is not down or unknown (the coordinator waits only
        on those)."""
        book = self.book
        members = set(book.eligible())
        if book.me in members and book.participates():
            return True
        return any(self.port.health(p) not in (None, PeerState.DOWN) for p in members - {book.me})

    async def _wait_for_members(self, rs: RoundState) -> None:
        """Every member is gone: say so, and wait (no polling) until one is back, the round
        commits through a peer, or a plan arrives."""
        book = self.book
        self._members_gone = True
        note = members_gone_note(len(set(book.eligible()) - {book.me}))
        if book.status.set_waiting(note):
            self.port.emit(EventKind.ROUND_WAITING, rs.round, message=f"job {self.job_id} round {rs.round}: {note}")
        try:
            await book.changed.wait_for(lambda: self._moved_on(rs) or self.anyone_to_plan(),
                                        self.port.clock.now() + MEMBERS_GONE_RECHECK_S)
        finally:
            self._members_gone = False
            if book.status.waiting == note and self.anyone_to_plan():
                book.status.set_waiting("")

    async def _await_commit(self, rs: RoundState, plan: Plan) -> str | None:
        """Wait for round ``rs.round`` to commit; the reason it will not, otherwise."""
        book, clock, port = self.book, self.port.clock, self.port
        grace_until = clock.now() + COORDINATOR_GRACE_S
        deadlines = rs.deadlines
        while not book.round_over(rs):
            if rs.plan is not None and rs.plan.attempt > plan.attempt:
                plan, deadlines = rs.plan, rs.deadlines
            if plan.attempt in rs.aborted:
                return "aborted by its coordinator"
            assert deadlines is not None  # set with every plan in force
            now = clock.now()
            if now >= deadlines.end:
                return "deadline passed"
            if plan.coordinator != book.me and port.health(plan.coordinator) == PeerState.DOWN and now >= grace_until:
                return f"coordinator {plan.coordinator[-8:]} is down"
            await book.changed.wait(min(deadlines.end, grace_until) if now < grace_until else deadlines.end)
        return None

    async def on_plan(self, msg: Inbound) -> None:
        try:
            plan, deadlines = await self.coordinator.accept(msg)
        except PlanAhead as ahead:
            self.plans_ahead.hold(msg, ahead)
            raise
        self._start_roles(plan, deadlines)

    def _start_roles(self, plan: Plan, deadlines: RoundDeadlines) -> None:
        """This node's part in a plan now in force: member always, leader or root with children."""
        book = self.book
        if book.me not in plan.parent:
            book.status.set_role(Role.IDLE)
            return
        is_root = plan.coordinator == book.me
        has_children = bool(children(plan.parent, book.me))
        book.status.set_role(Role.ROOT if is_root else (Role.LEADER if has_children else Role.MEMBER))
        if is_root or has_children:
            book.tasks.start_soon(self._lead, plan, deadlines, self.leader.open(plan, deadlines, is_root))
        book.tasks.start_soon(self.member.train_and_send, plan, deadlines)

    async def _lead(self, plan: Plan, deadlines: RoundDeadlines, col: Collector) -> None:
        """Reduce the group, then commit (the root) or send the partial up (a leader)."""
        try:
            reduced = await self.leader.reduce(plan, col)
            if reduced is None:
                return
            if plan.coordinator == self.book.me:
                await self.root.commit(plan, reduced)
                self.member.committed(plan.round)
            else:
                await self.leader.send_partial(plan, deadlines, reduced)
        except (SendError, WireError, OSError) as exc:
            self.port.emit(EventKind.PARTIAL_FAILED, plan.round, message=(
                f"round {plan.round}: partial not delivered: {exc}"))
        except Exception as exc:  # the job's rule may be a user's plug-in, which may raise anything
            log.exception("reduce for round %d failed", plan.round)
            self.port.emit(EventKind.PARTIAL_FAILED, plan.round, message=f"round {plan.round}: reduce failed: {exc}")

    # -- what the job manager asks of a job -----------------------------------------------------------

    @property
    def state(self) -> JobState:
        return self.book.status.state

    @property
    def failure(self) -> str:
        """Why this job failed here ("" unless it did): presence tells its peers. Without the
        local paths the error quotes (``safetext.without_paths``): they name the operator's
        user and directories, which are no peer's business; ``job status`` here keeps them."""
        status = self.book.status
        if status.state != JobState.FAILED:
            return ""
        return without_paths(status.error or "failed")[:FAILED_REASON_CHARS]

    @property
    def committed(self) -> int:
        return self.book.committed

    @property
    def rounds(self) -> int:
        return self.spec.rounds

    def job_frame(self) -> bytes:
        return self.book.info.frame

    def ledger_frames(self) -> Sequence[bytes]:
        return self.book.ledger.frames

    def chain_check(self, start: int = 0) -> ChainCheck:
        return ChainCheck(self.book.ledger, start)

    def participates(self) -> bool:
        return self.book.participates()

    def known_members(self) -> set[str]:  # the peers this job's presence goes to
        return self.book.known_members()

    def head(self) -> str:
        """This job's ledger head as presence names it."""
        return self.book.ledger.head[:HEAD_CHARS]

    def notify(self) -> None:
        """Something outside the job changed (a peer's health): re-check what waits on it."""
        self.book.changed.notify()

    @property
    def weight(self) -> int:
        """This job's ledger weight in fork choice: its verified contributions."""
        return self.book.ledger.weight

    def saw_presence(self, peer: str, seen: JobPresence | None, *, failed: str = "") -> bool:
        """Record ``peer``'s presence (``seen``; None when it names this job only as failed): its
        training throughput for this job, whether it is still preparing the job, the round
        whose coordinator turns it passes, and why the job failed there, if it says. True when
        its ledger, as it describes it, may win over ours."""
        if seen is None:
            self.book.saw_presence(peer, None, failed=failed)
            return False
        passes = seen.passes if seen.passes is not None and seen.passes <= self.spec.rounds else None
        self.book.saw_presence(peer, seen.rate, preparing=seen.preparing, passes=passes, failed=failed)
        return self.may_win(seen.claim)

    @property
    def preparing(self) -> bool:
        """Still loading this job's data and measuring the device: not yet able to take part."""
        return not self.book.ready.is_set()

    @property
    def passes_round(self) -> int:
        """The round whose coordinator turns this node passes (while preparing, or because it
        skips its own turns: ``Turns.passes_own_turns``); 0 if none is current."""
        passed = self.book.passed_now()
        if passed:
            return passed
        return self.book.current.round if self.book.loaded and self.coordinator.turns.passes_own_turns() else 0

    def may_win(self, claim: LedgerClaim) -> bool:
        """Whether a peer's ledger, as it describes it, is worth fetching (``ResultApplier.may_win``)."""
        return self.applier.may_win(claim)

    def throughput(self) -> float:
        """This node's training throughput for this job (samples per second; 0 if unknown)."""
        return self.book.rates.get(self.book.me, 0.0)

    async def offer_ledger(self, frames: Sequence[bytes], peer: str, held: int = 0) -> bool:
        return await self.applier.offer_ledger(frames, peer, held)

    async def payload_limit(self, sender: str) -> int:
        """How large an update or partial from ``sender`` may be: what this job's model allows,
        from a peer that could be sending one; nothing from anyone else. Rejected (no
        penalty) while the job is still being prepared here."""
        book = self.book
        with trio.move_on_after(PAYLOAD_READY_WAIT_S):
            await book.ready.wait()
        if not book.ready.is_set():
            raise Rejected(f"job {self.job_id} is not prepared on this node yet")
        return book.payload_limit() if book.may_send_work(sender) else 0

    def check_quorum(self) -> None:
        self.quorum.check(self._members_gone)

    def recent_blobs(self) -> set[str]:
        return self.models.recent()

    def summary(self) -> dict[str, Any]:
        return summarize(self.book, trio.current_time())

    def ledger_rows(self) -> list[dict[str, Any]]:
        return ledger_rows(self.book)

    def export(self) -> JobExport:
        """What ``export_results`` writes, taken now (it runs in a worker thread)."""
        book = self.book
        return job_export(self.job_id, self.spec, book.head_model, book.ledger.results, self.port.blobs,
                          self.trainer(), metric_rows(book), ledger_rows(book), book.ledger.path)
