"""The leader's side of a round (the root's too): verify and fold what the group sends, then
hand the reduced result on.

A collector folds each verified update or child partial the moment it arrives, so reduction
overlaps with stragglers still training. The leader waits for its children until its reduce
deadline, expecting the children of any child that goes down instead, and under secure
aggregation asks the survivors for the seed shares that unmask the sum after a dropout.
"""

from __future__ import annotations

import logging
from itertools import takewhile
from typing import Any

import numpy as np

from aggregation.secagg import SecAggError
from gpuflex.node.collector import Collector, Reduced, ancestors, descendants, subtree_height
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.messages import (
    EMPTY,
    PARTIAL,
    TAKEN,
    Plan,
    TrainedUpdate,
    parse_partial,
    parse_update,
    walk_contributions,
)
from gpuflex.node.core.pipeline import decode_update, make_reducer, pack_partial, unpack_partial
from gpuflex.node.core.secure import SecAggReducer
from gpuflex.node.core.taken import parse_empty, parse_taken
from gpuflex.node.core.workfields import WireValue
from gpuflex.node.core.workplan import fold_vector
from gpuflex.node.policy import IncidentPolicy
from gpuflex.node.port import JobPort
from gpuflex.node.recovery import collect_answers
from gpuflex.node.state import JobBook, RoundDeadlines
from gpuflex.node.uplink import Work, dropped, send_up
from mesh.blob import blob_hash
from mesh.codec import WireError, WireReason, seal
from mesh.health import PeerState
from mesh.messaging import Inbound, Rejected, SendError

log = logging.getLogger("gpuflex.leader")
#: An update may reach its leader before the plan does: it waits this long for the plan.
EARLY_MESSAGE_WAIT_S = 5.0
#: A survivor gets at least this long (or one reduce slack) to answer a recovery request.
RECOVERY_TIMEOUT_MIN_S = 2.0
#: The whole recovery round trip gets this much beyond one survivor's timeout.
RECOVERY_MARGIN_S = 1.0
#: A ``Taken`` notice to a node that work went past gets this long (or one reduce slack).
TAKEN_TIMEOUT_MIN_S = 2.0


class Leader:
    def __init__(self, port: JobPort, book: JobBook, incidents: IncidentPolicy) -> None:
        self.port, self.book, self.incidents = port, book, incidents

    def open(self, plan: Plan, deadlines: RoundDeadlines, is_root: bool) -> Collector:
        """Start collecting for ``plan``; the collector is this round's for its attempt."""
        book = self.book
        height = subtree_height(plan.parent, book.me)
        col = Collector(plan, book.me, make_reducer(book.spec, is_root, plan=plan, me=book.me),
                        deadline=deadlines.reduce_by(height), on_done=book.changed.notify)
        book.current.open_collector(plan.attempt, col)
        return col

    def fold_own(self, plan: Plan, trained: TrainedUpdate) -> bool:
        """Fold this node's own update into the collector it runs for ``plan``, typed as it was
        made (nothing parsed or verified again); False if it runs none, or if that one closed
        while this node trained (it sends the update up). Folded into a closed collector, a
        slow leader's own update was lost: nothing sends a collector's work after it closes."""
        rs = self.book.current
        col = rs.collectors.get(plan.attempt) if rs.round == plan.round else None
        if col is None or col.closed or col.plan.env.digest != plan.env.digest:  # none, closed, or a replaced plan's
            return False
        spec, up = self.book.spec, trained.update
        col.add_update(up, fold_vector(spec, plan, up, decode_update(spec, trained.payload, up.delta_size)))
        return True

    # -- inbound ---------------------------------------------------------------------------------

    async def _collector_for(self, job: str, round_: int, sender: str) -> Collector:
        book = self.book

        def ready() -> bool:
            rs = book.current
            return book.committed >= round_ - 1 and rs.round == round_ and rs.plan is not None \
                and rs.plan.attempt in rs.collectors

        if job == book.job_id and round_ >= book.current.round:
            # the plan may reach this leader after the update
            await book.changed.wait_for(ready, self.port.clock.now() + EARLY_MESSAGE_WAIT_S)
        if job != book.job_id or round_ != book.current.round:
            raise WireError(WireReason.ROUND, f"message for round {round_}, this node is at round {book.current.round}")
        rs = book.current
        col = rs.collectors.get(rs.plan.attempt) if rs.plan is not None and rs.round == round_ else None
        if col is None or not col.accepts(sender):
            raise Rejected(f"not collecting from {sender[-8:]} for round {round_}")
        return col

    async def on_update(self, msg: Inbound) -> None:
        up = parse_update(msg.envelope)
        col = await self._collector_for(up.job, up.round, up.peer)
        if up.plan != col.plan.digest:
            raise WireError(WireReason.ROUND, f"update from {up.peer[-8:]} was made for another plan")
        if up.base_hash != col.plan.base_hash:
            raise WireError(WireReason.ROUND, "update was trained from another base model")
        if msg.payload is None or blob_hash(msg.payload) != up.delta_hash:
            raise WireError(WireReason.HASH, f"delta from {up.peer[-8:]} does not match its signed hash")
        spec = self.book.spec
        col.add_update(up, fold_vector(spec, col.plan, up, decode_update(spec, msg.payload, up.delta_size)))
        self.port.emit(EventKind.UPDATE_RECEIVED, up.round, up.peer,
                       message=f"round {up.round}: update from {up.peer[-8:]}")
        self._tell_passed(col.plan, up.peer, {up.peer})

    async def on_partial(self, msg: Inbound) -> None:
        part = parse_partial(msg.envelope)
        col = await self._collector_for(part.job, part.round, part.leader)
        if msg.payload is None or blob_hash(msg.payload) != part.delta_hash:
            raise WireError(WireReason.HASH, f"partial from {part.leader[-8:]} does not match its signed hash")
        ups = walk_contributions(part.updates, part.partials, part.job, part.round, col.plan)
        covers = {u.peer for u in ups}
        if not covers <= col.allowed or col.overlaps(covers | {part.leader}) \
                or sum(u.samples for u in ups) != part.samples:
            raise WireError(WireReason.ROUND, f"partial from {part.leader[-8:]} covers the wrong contributions")
        if any(u.base_hash != col.plan.base_hash for u in ups):
            raise WireError(WireReason.ROUND, "partial mixes updates from another base model")
        col.add_partial(part, unpack_partial(self.book.spec, msg.payload,
                                             ups[0].delta_size if ups else len(msg.payload) // 4), ups)
        self.port.emit(EventKind.PARTIAL_VERIFIED, part.round, part.leader, message=(
            f"round {part.round}: partial from {part.leader[-8:]} verified ({len(ups)} updates)"))
        self._tell_passed(col.plan, part.leader, covers | {part.leader})

    # -- work that went past a node ----------------------------------------------------------------

    def _tell_passed(self, plan: Plan, sender: str, covers: set[str]) -> None:
        """``sender``'s work reached this node past its own parent (and any node between): tell
        each such node that is not down, so it stops waiting for that work. Without the word a
        leader whose member could not reach it (a relayed link re-established mid-send) waited
        for the member until its own deadline, and the root for the leader."""
        if plan.parent.get(sender) == self.book.me:  # from a child: nothing went past anyone
            return
        chain = list(takewhile(lambda node: node != self.book.me, ancestors(plan.parent, sender)))
        passed = [p for p in chain if self.port.health(p) != PeerState.DOWN]
        if not passed:
            return
        frame = seal(self.port.identity, TAKEN, {
            "job": self.book.job_id, "round": plan.round, "attempt": plan.attempt, "plan": plan.digest,
            "by": self.book.me, "peers": sorted(covers)})
        for node in passed:
            self.book.tasks.start_soon(self._tell, plan, node, frame)

    async def _tell(self, plan: Plan, node: str, frame: bytes) -> None:
        try:
            await self.port.request(node, frame, timeout=max(TAKEN_TIMEOUT_MIN_S, plan.reduce_slack_s))
        except SendError as exc:  # it waits until its deadline, as it did before notices
            log.info("round %d: could not tell %s what went past it: %s", plan.round, node[-8:], exc)

    async def _say_empty(self, plan: Plan, parent: str) -> None:
        """Tell ``parent`` that this leader has nothing to send, so it stops waiting for it."""
        frame = seal(self.port.identity, EMPTY, {
            "job": self.book.job_id, "round": plan.round, "attempt": plan.attempt, "plan": plan.digest,
            "leader": self.book.me})
        try:
            await self.port.request(parent, frame, timeout=max(TAKEN_TIMEOUT_MIN_S, plan.reduce_slack_s))
        except SendError as exc:  # it waits for this node until its deadline, as before the notice
            log.info("round %d: could not tell %s this node has nothing to send: %s", plan.round, parent[-8:], exc)

    def _collector_of(self, job: str, round_: int, attempt: int, digest: str) -> Collector:
        """The collector a notice is about, or Rejected: its plan no longer in force here."""
        rs = self.book.current
        col = rs.collectors.get(attempt) if job == self.book.job_id and rs.round == round_ else None
        if col is None or col.plan.digest != digest:
            raise Rejected(f"no collector for round {round_} attempt {attempt} here")
        return col

    async def on_empty(self, msg: Inbound) -> None:
        """A child leader has nothing to send: stop waiting for it."""
        empty = parse_empty(msg.envelope)
        col = self._collector_of(empty.job, empty.round, empty.attempt, empty.plan)
        if col.plan.parent.get(empty.leader) != self.book.me:
            raise WireError(WireReason.ROUND, f"{empty.leader[-8:]} is not this node's child in the plan's tree")
        col.nothing_from(empty.leader)
        log.info("round %d: %s has nothing to send; not waiting for it", empty.round, empty.leader[-8:])

    async def on_taken(self, msg: Inbound) -> None:
        """An ancestor folded work that went past this node: stop waiting for it."""
        taken = parse_taken(msg.envelope)
        col = self._collector_of(taken.job, taken.round, taken.attempt, taken.plan)
        if taken.by not in ancestors(col.plan.parent, self.book.me):
            raise WireError(WireReason.ROUND, f"{taken.by[-8:]} is not above this node in the plan's tree")
        peers = set(taken.peers)
        if not peers <= descendants(col.plan.parent, self.book.me):
            raise WireError(WireReason.ROUND, f"{taken.by[-8:]} names peers outside this node's subtree")
        both = col.taken_above(peers)
        self.port.emit(EventKind.WORK_TAKEN_ABOVE, taken.round, taken.by, message=(
            f"round {taken.round}: {taken.by[-8:]} took {len(peers)} contribution(s) that went past this node"))
        if both:
            log.info("round %d: %d contribution(s) reached both this node and %s; this node's partial "
                     "carries them, and %s drops the copy it holds aside", taken.round, len(both),
                     taken.by[-8:], taken.by[-8:])

    # -- reduce ----------------------------------------------------------------------------------

    async def _collect(self, col: Collector) -> None:
        """Wait for the children, expecting the children of any child that goes down instead.
        A child whose presence says the job failed there (``JobBook.left``) is gone alike: it
        was planned before its word arrived, and will send nothing."""
        changed = self.book.changed
        while (not col.done.is_set() or self._short(col)) and self.port.clock.now() < col.deadline:
            for child in sorted(col.expected - col.reported - {self.book.me}):
                failed = self.book.left.get(child)
                if failed is not None or self.port.health(child) == PeerState.DOWN:
                    col.child_down(child)
                    why = "is down" if failed is None else f"is gone: the job failed there ({failed})"
                    self.port.emit(EventKind.LEADER_DOWN, col.plan.round, child, message=(
                        f"round {col.plan.round}: {child[-8:]} {why}; expecting its group directly"))
            if not col.done.is_set() or self._short(col):
                await changed.wait(col.deadline)  # a child's report and a peer's health both notify
        col.close()

    def _short(self, col: Collector) -> bool:
        """The root, every child reported, still short of ``min_nodes``: a member that a
        partial left out and that is neither down here nor gone may yet fail over to the root
        (its leader marked it down while a relayed link was not up). Aborting at once retried
        the round attempt after attempt within seconds, each short alike; the root waits for
        such members until its deadline instead. Not under secure aggregation, where a member's
        update is masked for its own group's sum."""
        book = self.book
        if col.plan.coordinator != book.me or book.spec.secure_aggregation \
                or col.contributions >= book.spec.min_nodes:
            return False
        return any(p not in col.covered and p != book.me and p not in book.left
                   and self.port.health(p) != PeerState.DOWN for p in col.plan.members)

    async def reduce(self, plan: Plan, col: Collector) -> Reduced | None:
        """Everything folded for ``plan`` once the collector closes; None when the round moved
        on meanwhile or nothing arrived."""
        book = self.book
        await self._collect(col)
        if (plan.attempt in book.current.aborted and book.current.round == plan.round) \
                or book.committed >= plan.round:
            dropped(self.port, book, plan, Work.PARTIAL)
            return None
        if col.acc.count == 0:
            self.port.emit(EventKind.REDUCE_EMPTY, plan.round,
                           message=f"round {plan.round}: nothing reached this leader ({col.how_reported()})")
            # Only once every child is accounted for: a child not reported by the deadline may
            # still send past this node to the parent, which must then still be waiting. Said at
            # any closing, it let the root stop waiting early, and at 1,000 simulated nodes round
            # 1 committed in 9 s with 17 contributors.
            parent = plan.parent.get(book.me)
            if parent is not None and col.expected - col.reported <= {book.me}:
                book.tasks.start_soon(self._say_empty, plan, parent)
            return None
        updates, samples = col.updates, col.samples
        group_reports = [r for p in col.partials for r in p.secagg]
        avg: np.ndarray | None
        if isinstance(col.acc, SecAggReducer):
            avg, report = await self._secagg_unmask(plan, col.acc)
            group_reports.insert(0, report)
            if avg is None:  # the masked sum is lost: keep only what came in clear
                updates = [u for u in col.updates if u.peer not in col.acc.ctx.group]
                samples = sum(u.samples for u in updates) + sum(p.samples for p in col.partials)
                avg = col.acc.plain_result()
        else:
            avg = col.acc.result()
        return Reduced(avg, updates, col.partials, samples, group_reports, col.within)

    async def send_partial(self, plan: Plan, deadlines: RoundDeadlines, reduced: Reduced) -> None:
        """Sign the group's partial and deliver it up the tree."""
        if reduced.avg is None:
            self.port.emit(EventKind.PARTIAL_FAILED, plan.round, message=(
                f"round {plan.round}: nothing left to send after secure aggregation failed"))
            return
        payload = pack_partial(self.book.spec, reduced.avg)
        body: dict[str, Any] = {
            "job": self.book.job_id, "round": plan.round, "attempt": plan.attempt, "leader": self.book.me,
            "samples": reduced.samples, "delta_hash": blob_hash(payload),
            "updates": [u.env.raw for u in reduced.updates], "partials": [p.env.raw for p in reduced.partials],
        }
        if self.book.spec.secure_aggregation:
            body["secagg"] = reduced.group_reports
        frame = seal(self.port.identity, PARTIAL, body)
        await send_up(self.port, self.book, plan, deadlines, frame, payload, Work.PARTIAL)

    # -- secure aggregation ----------------------------------------------------------------------

    async def _secagg_unmask(self, plan: Plan, red: SecAggReducer) -> tuple[np.ndarray | None, dict[str, Any]]:
        """The group mean, after asking the survivors for the shares that rebuild the masks
        dropped members left dangling; None (and a failed report) rather than a wrong sum."""
        survivors, dropped = red.survivors(), red.missing()
        report: dict[str, Any] = {"leader": self.book.me, "attempt": plan.attempt, "survivors": survivors,
                                  "dropped": dropped, "recovered": True, "reason": ""}
        try:
            if dropped:
                red.check_recoverable()
                await self._ask_survivors(plan, red)
            avg = red.result()
        except SecAggError as exc:
            report.update(recovered=False, reason=str(exc))
            self.port.emit(EventKind.SECAGG_RECOVERY_FAILED, plan.round, message=(
                f"round {plan.round}: secure aggregation could not recover the group sum ({exc}); "
                f"the {len(survivors)} masked update(s) of this group are left out"))
            return None, report
        if dropped:
            self.port.emit(EventKind.SECAGG_RECOVERED, plan.round, message=(
                f"round {plan.round}: unmasked the sum of {len(survivors)} survivors after "
                f"{len(dropped)} member(s) dropped"))
        return avg, report

    async def _ask_survivors(self, plan: Plan, red: SecAggReducer) -> None:
        """One bounded round trip to all survivors at once; a survivor that does not answer in
        time only counts against the threshold, one whose answer is bad is also penalised."""
        timeout = max(RECOVERY_TIMEOUT_MIN_S, plan.reduce_slack_s)

        async def request(holder: str, frame: bytes) -> WireValue:
            return await self.port.request(holder, frame, timeout=timeout)

        problems = await collect_answers(self.port.identity, red, request, timeout + RECOVERY_MARGIN_S)
        for holder, exc in sorted(problems.items()):
            if isinstance(exc, WireError):
                self.incidents.rejected(holder, plan.round,
                                      f"round {plan.round}: recovery answer from {holder[-8:]} rejected: {exc}")
            else:
                log.warning("round %d: no recovery answer from %s: %s", plan.round, holder[-8:], exc)
