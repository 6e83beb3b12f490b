"""Result application: check a round's result (or a peer's whole ledger), hold its model,
append it (or adopt the ledger), and credit its contributors.

A result is applied only if it extends this node's ledger exactly and its evidence holds
(``evidence.verify_round``: the plan from the coordinator its attempt belongs to, min_nodes
signed updates made for that plan, the hash links), checked before its model is fetched. A
result for a round already committed here loses to ours unless it carries its evidence and
the chain it ends wins fork choice (``forkchoice.prefer_chain``: the heavier chain, then the
longer, then the earlier attempt where they differ); a ledger from catch-up sync is checked
round by round the same way, and may be shorter than ours if it is heavier. A finished job's
ledger is final. An aborted attempt is recorded so its round is retried.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpuflex.errors import GpuflexError
from gpuflex.node.core.evidence import EvidenceError, verify_round
from gpuflex.node.core.forkchoice import prefer_chain
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.ledger import (
    HEAD_CHARS,
    LedgerClaim,
    LedgerError,
    verify_chain,
    verify_tail,
)
from gpuflex.node.core.messages import RESULT, Result, parse_result, parse_secagg_reports
from gpuflex.node.models import Models
from gpuflex.node.policy import IncidentPolicy
from gpuflex.node.port import JobPort
from gpuflex.node.state import JobBook
from mesh.codec import WireError, WireReason, open_envelope
from mesh.errors import MeshError
from mesh.fsutil import StateWriteError
from mesh.messaging import Inbound, Rejected

log = logging.getLogger("gpuflex.apply")
#: Distinct other final ledgers of a finished job reported (each once).
MAX_FORKS_REPORTED = 8


class ResultApplier:
    def __init__(self, port: JobPort, book: JobBook, models: Models, incidents: IncidentPolicy) -> None:
        self.port, self.book, self.models, self.incidents = port, book, models, incidents
        self._forks_seen: set[str] = set()

    async def on_result(self, msg: Inbound) -> None:
        book = self.book
        res = parse_result(msg.envelope)
        if res.job != book.job_id:
            raise WireError(WireReason.GARBLED, "result for another job")
        if res.round <= book.committed:
            refused = self._compete(msg.envelope.raw, res, msg.via)
            if refused:
                raise Rejected(refused)
            return
        book.tasks.start_soon(self.apply, msg.envelope.raw, res, msg.via)

    def _compete(self, frame: bytes, res: Result, via: str) -> str:
        """A result for a round already committed here: it loses to ours unless its evidence
        holds and it wins fork choice. Returns why it is not taken ("" when it was rejected,
        logged and penalised for evidence that does not hold)."""
        book = self.book
        ours = book.ledger.results[res.round - 1]
        if ours.digest == res.digest:
            return f"round {res.round} is already committed here"
        if book.finished:
            return f"job {book.job_id} is finished: its ledger is final"
        if res.prev_result != ours.prev_result:
            # Forked earlier: only its whole chain can show whether it wins. Fetch it; it is
            # checked round by round before anything changes here.
            book.tasks.start_soon(self.port.catch_up, [res.coordinator, via])
            return f"result for round {res.round} on another branch; fetching its chain"
        try:  # the same parent: this one result's evidence decides if it counts at all
            verify_round(res, book.ledger.history(res.round - 1), book.ledger.rules)
        except EvidenceError as exc:
            self.incidents.rejected(res.coordinator, res.round, f"competing result rejected: {exc}")
            return ""
        # The chain it ends may be shorter than ours and still heavier (more contributions).
        if prefer_chain(book.ledger.results, [*book.ledger.results[: res.round - 1], res]):
            frames = [*book.ledger.frames[: res.round - 1], frame]
            book.tasks.start_soon(self.offer_ledger, frames, res.coordinator)
            return f"competing result for round {res.round} wins fork choice; adopting it"
        return f"round {res.round} is already committed here"

    async def apply(self, frame: bytes, res: Result, via: str = "") -> None:
        """Append ``res`` if it extends the ledger and its evidence holds; penalise its signer if not."""
        book, port = self.book, self.port
        async with book.apply_lock:
            if res.round <= book.committed:
                # Its round committed here while it waited for the lock (the honest result came
                # first): judge it as a competing result, so a forgery is still logged and penalised.
                refused = self._compete(frame, res, via)
                if refused:
                    log.debug("result for round %d from %s not taken: %s", res.round, res.coordinator[-8:], refused)
                return
            if res.round != book.current.round or res.prev_result != book.ledger.head:
                if res.round >= book.current.round:
                    # Behind, or on another branch: fetch the chain (outside this lock).
                    book.tasks.start_soon(port.catch_up, [res.coordinator])
                return
            try:
                book.ledger.check_next(res)  # before its model is fetched: evidence first
                await self.models.hold_committed(res)
                book.ledger.append(frame, res, checked=True)
                self.incidents.write_recovered(book.committed)
                self.models.prune()
                if res.coordinator == book.me:
                    # One provider record a round, the root's: every member holds the model
                    # too, but a record from each of them was a DHT walk and k stores per
                    # member per round, and members fetch down the round's tree, not by lookup.
                    book.tasks.start_soon(port.announce_blob, res.model_hash)
            except (LedgerError, WireError) as exc:
                self.incidents.rejected(res.coordinator, res.round, f"round {res.round}: result rejected: {exc}")
                return
            except StateWriteError as exc:
                self.incidents.write_failed(res.round, exc)
                return
            except (MeshError, GpuflexError, OSError, ValueError) as exc:  # the model could not be held
                port.emit(EventKind.COMMIT_FAILED, res.round, message=(
                    f"round {res.round}: could not record the result: {exc}"))
                return
            for c in res.contributors:
                if isinstance(c.get("peer"), str):
                    port.credit(c["peer"])
            met = res.metrics
            port.emit(EventKind.ROUND_COMMITTED, res.round, res.coordinator, message=(
                f"round {res.round} committed by {res.coordinator[-8:]}: loss {met.get('loss', float('nan')):.3f}, "
                f"accuracy {met.get('accuracy', float('nan')):.3f}, {met.get('contributors')} contributors"),
                metrics=met)
            book.advance()

    async def offer_ledger(self, frames: Sequence[bytes], peer: str, held: int = 0) -> bool:
        """Adopt ``peer``'s ledger of this job if every round of it carries its evidence and it
        wins fork choice over ours; True if adopted. A finished job's ledger is final.
        ``held``: its first rounds are this node's own (a catch-up that resumed after them)."""
        book, port = self.book, self.port
        async with book.apply_lock:
            ours = book.ledger.frames  # read from the file: compared once, up to the first difference
            start = held if self._still_ours(frames, held) else 0
            same = next((i for i in range(start, min(len(ours), len(frames))) if ours[i] != frames[i]),
                        min(len(ours), len(frames)))
            if same == len(frames):  # theirs is a prefix of ours
                return False
            if book.finished:
                self._keep_final(frames, peer)
                return False
            try:
                # The common prefix is ours, already verified: check from where they differ.
                results = [*book.ledger.results[:same], *verify_tail(frames, same, book.ledger)]
                if not prefer_chain(book.ledger.results, results):
                    return False
                forked = same < len(ours)
                await self.models.hold_head(results, [peer, results[-1].coordinator])
                book.ledger.replace(frames, results)
                self.incidents.write_recovered(book.committed)
                if forked:
                    port.emit(EventKind.LEDGER_FORK_RESOLVED, len(results), peer, message=(
                        f"job {book.job_id}: switched to the winning branch from {peer[-8:]}"))
            except (LedgerError, WireError) as exc:
                self.incidents.rejected(peer, None, f"ledger from {peer[-8:]}: {exc}")
                return False
            except StateWriteError as exc:
                self.incidents.write_failed(len(frames), exc)
                return False
            except (MeshError, GpuflexError, OSError, ValueError) as exc:  # its model could not be held
                log.warning("could not adopt the ledger from %s: %s", peer[-8:], exc)
                return False
            port.emit(EventKind.LEDGER_SYNCED, book.committed, peer, message=(
                f"job {book.job_id}: caught up to round {book.committed} from {peer[-8:]}"))
            book.advance()
            return True

    def _still_ours(self, frames: Sequence[bytes], held: int) -> bool:
        """Whether the first ``held`` of ``frames`` are still this ledger's first rounds (it may
        have switched branch since a catch-up began): the round at ``held`` has our digest, and
        a digest covers every round before it through the hash chain. One frame read, not
        ``held`` of them."""
        results = self.book.ledger.results
        if not held or held > len(results) or held > len(frames):
            return False
        try:
            return open_envelope(frames[held - 1], expect_kind=RESULT).digest == results[held - 1].digest
        except WireError:
            return False

    def may_win(self, claim: LedgerClaim) -> bool:
        """Whether a peer's ledger of this job, as the peer describes it (unchecked), is worth
        fetching: it could win fork choice (``Ledger.may_win``). A finished job's ledger is
        final however heavy a peer's: it fetches only a ledger on a head not reported yet."""
        if self.book.finished:
            return self.worth_reporting(claim.head)
        return self.book.ledger.may_win(claim)

    def worth_reporting(self, head: str | None) -> bool:
        """Whether a finished job should fetch a peer's ledger on ``head`` (a presence or sync
        page's head prefix) to report it: another head, not reported yet, within the cap."""
        return (head is not None and head != self.book.ledger.head[:HEAD_CHARS]
                and len(self._forks_seen) < MAX_FORKS_REPORTED
                and not any(h.startswith(head) for h in self._forks_seen))

    def _keep_final(self, frames: Sequence[bytes], peer: str) -> None:
        """A finished job keeps its ledger; a different one that also carries its evidence (two
        halves of a partition that each finished the job) is reported once, not adopted."""
        book = self.book
        try:
            theirs = verify_chain(frames, book.job_id, book.ledger.rules)
        except LedgerError as exc:
            self.incidents.rejected(peer, None, f"ledger from {peer[-8:]}: {exc}")
            return
        head = theirs[-1].digest if theirs else ""
        if head in self._forks_seen or len(self._forks_seen) >= MAX_FORKS_REPORTED:
            return
        self._forks_seen.add(head)
        self.port.emit(EventKind.LEDGER_FORK_KEPT, book.committed, peer, message=(
            f"job {book.job_id} is finished here at round {book.committed} (head {book.ledger.head[:12]}); "
            f"{peer[-8:]} holds another verified ledger of {len(theirs)} rounds (head {head[:12]}). "
            "A finished job's ledger is final: this node keeps its own"))

    async def on_abort(self, msg: Inbound) -> None:
        book = self.book
        body = msg.envelope.body
        if not isinstance(body, dict) or body.get("job") != book.job_id:
            raise WireError(WireReason.GARBLED, "abort for another job")
        rs = book.current
        plan = rs.plan if rs.round == body.get("round") else None
        if plan is None or plan.coordinator != msg.envelope.sender or plan.attempt != body.get("attempt"):
            attempt = body.get("attempt")
            kept = [p for p in (rs.held.get(attempt) if isinstance(attempt, int) else None, rs.behind)
                    if p is not None and p.round == body.get("round") == rs.round and p.attempt == attempt
                    and p.coordinator == msg.envelope.sender]
            if kept:
                # A coordinator gave up an attempt whose plan this node keeps for later: drop
                # it, or this node would train for an attempt nobody collects any more.
                rs.abort(kept[0].attempt)
                book.changed.notify()
                return
            raise Rejected("abort does not match the plan in force")
        rs.abort(plan.attempt)
        if book.spec.secure_aggregation:  # the next coordinator records why this attempt failed
            group_reports = parse_secagg_reports(body.get("secagg", []), "abort")
            book.secagg_history = {r: v for r, v in book.secagg_history.items() if r >= plan.round}
            book.secagg_history.setdefault(plan.round, []).extend(group_reports)
        book.status.stall(f"round {plan.round} attempt {plan.attempt} aborted: {str(body.get('reason', ''))[:600]}")
        self.port.emit(EventKind.ROUND_ABORTED, plan.round, msg.envelope.sender, message=(
            f"round {plan.round}: coordinator aborted attempt {plan.attempt}: {body.get('reason', '')}"))
        book.changed.notify()
