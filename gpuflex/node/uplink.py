"""Sending work up the group tree, and sending it again if the receiver dies holding it.

Members send updates and leaders send partials the same way: to the parent, or the next live
ancestor; then they keep watching the receiver until the round commits, and deliver again one
level up if it goes down, so work a leader accepted is not lost with it. When every ancestor
failed (a stream reset while a relayed link is re-established, a parent still busy folding),
the chain is tried again after a pause while the round is open, a bounded number of times: the
update was trained at a cost, and the round waits for it until its deadline anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from gpuflex.node.collector import ancestors
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.messages import Plan
from gpuflex.node.port import JobPort
from gpuflex.node.state import JobBook, RoundDeadlines
from mesh.compat import StrEnum
from mesh.health import PeerState
from mesh.messaging import SendError

log = logging.getLogger("gpuflex.uplink")
#: A delivery up the tree gets at least this long (or two reduce slacks, if longer): the
#: receiver verifies and folds the payload before it answers.
SEND_TIMEOUT_MIN_S = 10.0
#: The slowest uplink an upload's timeout allows for (2 Mbit/s), so a member on a slow home line,
#: or two sharing one, is not cut off mid-update.
SLOWEST_UPLINK_BPS = 250_000
#: Passes over the chain of ancestors when each fails, and the pause between them.
SEND_PASSES, SEND_RETRY_S = 3, 2.0


class Work(StrEnum):
    """What travels up the tree."""

    UPDATE = "update"
    PARTIAL = "partial"


SENT = {Work.UPDATE: EventKind.UPDATE_SENT, Work.PARTIAL: EventKind.PARTIAL_SENT}


async def send_up(port: JobPort, book: JobBook, plan: Plan, deadlines: RoundDeadlines, frame: bytes,
                  payload: bytes, what: Work, masked: bool = False,
                  delivered: Callable[[], None] | None = None) -> None:
    """Deliver ``frame`` and ``payload`` up the tree and watch the receiver until the round
    ends. A masked update goes to its own leader only: no other node could unmask it.
    ``delivered`` runs once, when the first receiver has taken it.
    Raises SendError when no ancestor took it and the round is still open."""
    if not book.round_open(plan):
        dropped(port, book, plan, what)
        return
    chain = ancestors(plan.parent, book.me)[: 1 if masked else None]
    errors: list[str] = []
    # A home uplink moves a model-sized payload in seconds to minutes, not in a fixed 10 s.
    timeout = max(SEND_TIMEOUT_MIN_S, plan.reduce_slack_s * 2, len(payload) / SLOWEST_UPLINK_BPS)
    for attempt in range(SEND_PASSES):
        if attempt:
            if port.clock.now() + SEND_RETRY_S >= deadlines.end:
                break
            log.info("round %d: no ancestor took this node's %s; trying again in %.0f s (pass %d of %d)",
                     plan.round, what, SEND_RETRY_S, attempt + 1, SEND_PASSES)
            await trio.sleep(SEND_RETRY_S)
        errors.clear()
        index = 0
        while index < len(chain) and book.round_open(plan):
            target = chain[index]
            index += 1
            if attempt and port.health(target) == PeerState.DOWN:
                continue
            try:
                await port.request(target, frame, payload, timeout=timeout)
            except SendError as exc:
                errors.append(str(exc))
                port.emit(EventKind.SEND_RETRIED, plan.round, target, message=(
                    f"round {plan.round}: {what} to {target[-8:]} failed ({exc}); trying the next ancestor"))
                continue
            port.emit(SENT[what], plan.round, target, message=f"round {plan.round}: {what} sent to {target[-8:]}")
            if delivered is not None:
                delivered()
                delivered = None
            if not await _watch(port, book, plan, deadlines, target):
                return
            port.emit(EventKind.RESEND, plan.round, target, message=(
                f"round {plan.round}: {target[-8:]} died holding this node's {what}; sending it higher"))
        if not errors or not book.round_open(plan):
            return
    if errors and book.round_open(plan):
        raise SendError("; ".join(errors))


def dropped(port: JobPort, book: JobBook, plan: Plan, what: Work) -> None:
    """Say that work done for ``plan`` is not sent, and why: a leader whose plan stopped being in
    force mid-round once kept its group's partial without a word, and its parent waited for it
    until its deadline with nothing to show why."""
    port.emit(EventKind.WORK_DROPPED, plan.round, message=(
        f"round {plan.round}: this node's {what} is not sent: {why_closed(book, plan)}"))


def why_closed(book: JobBook, plan: Plan) -> str:
    """Why work for ``plan`` no longer counts (``JobBook.round_open``); "" while it does."""
    rs = book.current
    if book.committed >= plan.round:
        return f"round {plan.round} is committed"
    if plan.round != rs.round:
        return f"this node is at round {rs.round}"
    if plan.attempt in rs.aborted:
        return f"attempt {plan.attempt} was aborted"
    if rs.plan is not None and rs.plan.attempt != plan.attempt:
        return f"attempt {rs.plan.attempt}'s plan is in force here"
    return ""


async def _watch(port: JobPort, book: JobBook, plan: Plan, deadlines: RoundDeadlines, target: str) -> bool:
    """Until the round closes or ends: True if ``target`` went down first."""
    while book.round_open(plan) and port.clock.now() < deadlines.end:
        if port.health(target) == PeerState.DOWN:
            return True
        await book.changed.wait(deadlines.end)
    return False
