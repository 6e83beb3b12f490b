"""Whether a job's members are enough to commit, in words for `job status`.

A side of a partition with fewer than ``min_nodes`` members reachable (or, in an open job,
fewer than most of the recent rounds' contributors) will not commit until more return; the
node says so, and which members are out of reach and why, so that it does not look merely
slow. Counted over the peers a plan may count (``plannable``): a key up by hearsay is not one.
"""

from __future__ import annotations

from gpuflex.node.port import JobPort
from gpuflex.node.roles.coordinator import plannable
from gpuflex.node.state import JobBook

#: Members named in the note, at most.
NAMED = 8


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
