"""Whether a job's members are enough to commit, in words for `job status`.

A side of a partition with fewer than ``min_nodes`` members reachable (or, in an open job,
fewer than most of the recent rounds' contributors) will not commit until more return; the
node says so, and which members are out of reach and why, so that it does not look merely
slow. Counted over the peers a plan may count (``plannable``): a key up by hearsay is not one.
"""

from __future__ import annotations

import math

from gpuflex.node.core.kinds import EventKind, JobState
from gpuflex.node.port import JobPort
from gpuflex.node.roles.turns import plannable
from gpuflex.node.state import JobBook

#: Members named in the note, at most.
NAMED = 8
#: A check walks the job's members, and every node checks each of its jobs: one of n members
#: is checked at most every ``n / MEMBERS_PER_S`` seconds (each second at first, and in any job
#: of up to that many), so a thousand-member job's checks do not cost a node more than the
#: rounds themselves (a quarter of a simulated 1,000-node mesh's CPU at once a second).
MEMBERS_PER_S = 100


class QuorumWatch:
    """Says when this side of the mesh cannot commit a job, and when it can again."""

    def __init__(self, book: JobBook, port: JobPort) -> None:
        self.book, self.port = book, port
        self._due = -math.inf

    def check(self, members_gone: bool) -> None:
        """Say so while fewer than min_nodes members (or, in an open job, than most of the
        recent contributors) are reachable: this side of a partition will not commit until
        more return, and must not look merely slow. ``members_gone``: the round loop said so
        already, and wakes when a member is back."""
        book, status = self.book, self.book.status
        if status.state != JobState.RUNNING:
            status.set_waiting("")
            return
        now = self.port.clock.now()
        if members_gone or now < self._due:
            return
        note, reachable = quorum_note(book, self.port)
        self._due = now + reachable / MEMBERS_PER_S
        if not status.set_waiting(note):
            return
        r, job = book.current.round, book.job_id
        if note:
            self.port.emit(EventKind.ROUND_WAITING, r, message=f"job {job} round {r}: waiting, {note}")
        else:
            self.port.emit(EventKind.QUORUM_RESTORED, r, message=(
                f"job {job} round {r}: {reachable} members reachable again (min_nodes={book.spec.min_nodes})"))


def quorum_note(book: JobBook, port: JobPort) -> tuple[str, int]:
    """The waiting note ("" when enough members are reachable) and how many are."""
    need = book.spec.min_nodes
    live = book.live_members(plannable(port, book))
    reachable = len(live)
    note = f"only {reachable} of min_nodes={need} members reachable; not committing" if reachable < need else ""
    kept, needed = book.ledger.rules.continuing(book.ledger.results, live)
    if not note and kept < needed:
        note = f"only {kept} of the {needed} recent contributors an open job needs are reachable; not committing"
    if note:
        note += missing_members(book, port, live)
    return note, reachable


def missing_members(book: JobBook, port: JobPort, live: list[str]) -> str:
    """Which members are out of reach and why, as far as this node can tell (their own
    NodeInfo says whether they are behind NAT and which relays hold a slot for them; a member
    whose job failed says why in its presence)."""
    allow = set(book.spec.allowlist)
    missing = sorted(p for p in set(book.info.initial_members) | set(book.eligible())
                     if p not in live and (not allow or p in allow))
    return "".join(f"; {peer[-8:]} " + (f"is gone: the job failed there ({book.left[peer]})" if peer in book.left
                                        else port.why_unreachable(peer)) for peer in missing[:NAMED])
