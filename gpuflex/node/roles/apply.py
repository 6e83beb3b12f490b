"""Result application: check a round's result (or a peer's whole ledger), hold its model,
append it (or adopt the ledger), and credit its contributors.

A result is applied only if it extends this node's ledger exactly and its evidence verifies
(``ledger.verify_chain``: the plan, every signed update, the hash links). A result for a
round already committed here loses to ours unless it wins fork choice, in which case this
node fetches the winning chain. An aborted attempt is recorded so its round is retried.
"""

from __future__ import annotations

import logging

from gpuflex.errors import GpuflexError
from gpuflex.node.kinds import EventKind
from gpuflex.node.ledger import LedgerError, prefer_chain, result_key, verify_chain
from gpuflex.node.messages import Result, parse_result, parse_secagg_reports
from gpuflex.node.models import Models
from gpuflex.node.policy import Reports
from gpuflex.node.port import JobPort
from gpuflex.node.state import JobBook
from mesh.codec import WireError
from mesh.errors import MeshError
from mesh.fsutil import StateWriteError
from mesh.messaging import Inbound, Rejected

log = logging.getLogger("gpuflex.apply")


class ResultApplier:
    def __init__(self, port: JobPort, book: JobBook, models: Models, reports: Reports) -> None:
        self.port, self.book, self.models, self.reports = port, book, models, reports

    async def on_result(self, msg: Inbound) -> None:
        book = self.book
        res = parse_result(msg.envelope)
        if res.job != book.job_id:
            raise WireError("garbled", "result for another job")
        if res.round <= book.committed:
            ours = book.ledger.results[res.round - 1]
            # A chain that forked earlier is judged where it forked (prefer_chain), which this
            # one result cannot show: fetch it. On the same parent, the result itself decides.
            forked_earlier = res.prev_result != ours.prev_result
            if ours.digest != res.digest and (forked_earlier or result_key(res) < result_key(ours)):
                book.tasks.start_soon(self.port.catch_up, [res.coordinator, msg.via])
                raise Rejected(f"competing result for round {res.round}; fetching its chain")
            raise Rejected(f"round {res.round} is already committed here")
        book.tasks.start_soon(self.apply, msg.envelope.raw, res)

    async def apply(self, frame: bytes, res: Result) -> None:
        """Append ``res`` if it extends the ledger and verifies; penalise its signer if not."""
        book, port = self.book, self.port
        async with book.apply_lock:
            if res.round != book.current.round or res.prev_result != book.ledger.head:
                if res.round >= book.current.round:
                    # Behind, or on another branch: fetch the chain (outside this lock).
                    book.tasks.start_soon(port.catch_up, [res.coordinator])
                return
            try:
                verify_chain([*book.ledger.frames, frame], book.job_id)
                if res.metrics.get("contributors", 0) < book.spec.min_nodes:
                    raise LedgerError(f"round {res.round}: fewer contributions than min_nodes")
                await self.models.hold_committed(res)
                book.ledger.append(frame, res)
                self.reports.write_recovered(book.committed)
                self.models.prune()
                # Any peer (a late joiner, a node resyncing) can now find the model by hash.
                book.tasks.start_soon(port.announce_blob, res.model_hash)
            except (LedgerError, WireError) as exc:
                self.reports.rejected(res.coordinator, res.round, f"round {res.round}: result rejected: {exc}")
                return
            except StateWriteError as exc:
                self.reports.write_failed(res.round, exc)
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

    async def offer_ledger(self, frames: list[bytes], peer: str) -> None:
        """Adopt ``peer``'s ledger of this job if it verifies and wins fork choice over ours."""
        book, port = self.book, self.port
        async with book.apply_lock:
            if frames == book.ledger.frames[: len(frames)]:
                return
            try:
                results = verify_chain(frames, book.job_id)
                if not prefer_chain(book.ledger.results, results):
                    return
                forked = frames[: len(book.ledger.frames)] != book.ledger.frames
                await self.models.load(results[-1].model_hash, [peer, results[-1].coordinator])
                book.ledger.replace(frames)
                self.reports.write_recovered(book.committed)
                if forked:
                    port.emit(EventKind.LEDGER_FORK_RESOLVED, len(results), peer, message=(
                        f"job {book.job_id}: switched to the winning branch from {peer[-8:]}"))
            except (LedgerError, WireError) as exc:
                self.reports.rejected(peer, None, f"ledger from {peer[-8:]}: {exc}")
                return
            except StateWriteError as exc:
                self.reports.write_failed(len(frames), exc)
                return
            except (MeshError, GpuflexError, OSError, ValueError) as exc:  # its model could not be held
                log.warning("could not adopt the ledger from %s: %s", peer[-8:], exc)
                return
            port.emit(EventKind.LEDGER_SYNCED, book.committed, peer, message=(
                f"job {book.job_id}: caught up to round {book.committed} from {peer[-8:]}"))
            book.advance()

    async def on_abort(self, msg: Inbound) -> None:
        book = self.book
        body = msg.envelope.body
        if not isinstance(body, dict) or body.get("job") != book.job_id:
            raise WireError("garbled", "abort for another job")
        rs = book.current
        plan = rs.plan if rs.round == body.get("round") else None
        if plan is None or plan.coordinator != msg.envelope.sender or plan.attempt != body.get("attempt"):
            raise Rejected("abort does not match the plan in force")
        rs.aborted.add(plan.attempt)
        if book.spec.secure_aggregation:  # the next coordinator records why this attempt failed
            reports = parse_secagg_reports(body.get("secagg", []), "abort")
            book.secagg_history = {r: v for r, v in book.secagg_history.items() if r >= plan.round}
            book.secagg_history.setdefault(plan.round, []).extend(reports)
        book.status.stall(f"round {plan.round} attempt {plan.attempt} aborted: {str(body.get('reason', ''))[:600]}")
        self.port.emit(EventKind.ROUND_ABORTED, plan.round, msg.envelope.sender, message=(
            f"round {plan.round}: coordinator aborted attempt {plan.attempt}: {body.get('reason', '')}"))
        book.changed.notify()
