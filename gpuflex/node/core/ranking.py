"""Who coordinates a round, computed identically on every node with no messages.

Members are ranked by ``H(job_id ‖ round ‖ peer_id)`` (rendezvous hashing). Plain rendezvous
can pick the same peer several rounds running, so the coordinators of the last few committed
rounds (read from the shared ledger, so every node agrees) are moved to the back: with four or
more members the coordinator always changes, and the load spreads. A retried attempt rotates
the ranking so the next backup leads.

Round 1 has no ledger, so nothing every node agrees on says who is fast or ready yet; its
ranking puts the job's owner (who signed the job, and so held it first) ahead, when it is an
eligible member. A slow machine that the hash happened to rank first used to coordinate the
first round only once it had loaded its data, and root it at its own pace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence


def rendezvous_rank(job_id: str, round_: int, members: Sequence[str]) -> list[str]:
    def score(peer: str) -> bytes:
        return hashlib.blake2b(f"{job_id}|{round_}|{peer}".encode(), digest_size=16).digest()

    return sorted(set(members), key=lambda p: (score(p), p))


def cooldown_size(n_members: int) -> int:
    return 0 if n_members < 2 else max(1, (n_members - 1) // 2)


def coordinator_ranking(job_id: str, round_: int, members: Sequence[str],
                        recent_coordinators: Sequence[str] = (), attempt: int = 0,
                        private: Collection[str] = (), first: str | None = None) -> list[str]:
    """``private``: members known to be behind NAT. They rank after every other member, since
    the coordinator is the round's root and receives from its children; with none known, the
    ranking is the plain one. ``first``: a member ranked ahead of the hash order (round 1's
    owner); ignored if it is no member."""
    ranked = rendezvous_rank(job_id, round_, members)
    if first in ranked:
        ranked = [first, *(p for p in ranked if p != first)]
    k = cooldown_size(len(ranked))
    cooling = set(recent_coordinators[-k:]) if k else set()
    ordered = [p for p in ranked if p not in cooling] + [p for p in ranked if p in cooling]
    if not ordered:
        return ordered
    # A retried attempt rotates each class on its own: the next reachable backup leads, and a
    # private member comes first only when no reachable one is left.
    reach = [p for p in ordered if p not in private]
    behind = [p for p in ordered if p in private]
    return _rotate(reach, attempt) + _rotate(behind, attempt)


def _rotate(items: list[str], attempt: int) -> list[str]:
    if not items:
        return items
    shift = attempt % len(items)
    return items[shift:] + items[:shift]
