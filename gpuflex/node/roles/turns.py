"""Whose turn it is to coordinate, as this node can tell: which candidates of the current round
will not plan their attempt (down, behind NAT or slow while a better one is up, passing their
turns), whether this node passes its own, and when a plan held for a later attempt need not wait
for an earlier candidate this node cannot hear.

Every node computes the same ranking (``ChainRules.expected_coordinator``); what may differ is
what each knows of the candidates (health, NodeInfo claims, presence). The coordinator role
(``roles/coordinator``) asks these questions; nothing here sends or waits.
"""

from __future__ import annotations

import math

import trio

from gpuflex.node.core.workplan import recorded_rates, slow_members
from gpuflex.node.port import JobPort
from gpuflex.node.state import PRESENCE_FRESH_S, JobBook, RoundState
from mesh.health import PeerState


def last_contributors(book: JobBook) -> set[str]:
    """The peers of the last committed round's result (none before the first)."""
    results = book.ledger.results
    return {str(c.get("peer")) for c in results[-1].contributors} if results else set()


def heard_lately(book: JobBook, peer: str) -> bool:
    """Whether ``peer``'s presence reached this node within ``PRESENCE_FRESH_S``. Presence only
    ever comes straight from its signer (a direct-only kind), so this is first-hand, even for
    a peer this node keeps no record of (a large mesh's peer table holds a bounded few)."""
    return trio.current_time() - book.presence.get(peer, -math.inf) <= PRESENCE_FRESH_S


def plannable(port: JobPort, book: JobBook) -> list[str]:
    """The peers a plan made here may count: those this node heard itself (``JobPort.heard_peers``),
    the last committed round's contributors that are up (each signed an update for a plan of this
    ledger, and a member a round old has often not yet spoken to the next coordinator), and the
    job's members whose presence came lately though this node keeps no record of them. A key up
    by hearsay alone is none of these: presence it signs and others forward proves nothing."""
    known = last_contributors(book)
    return sorted(set(port.heard_peers()) | {p for p in known if port.health(p) == PeerState.UP}
                  | {p for p in known | set(book.eligible()) if port.health(p) is None and heard_lately(book, p)})


class Turns:
    """The whose-turn questions for one job on one node."""

    def __init__(self, port: JobPort, book: JobBook) -> None:
        self.port, self.book = port, book
        # When this node took the job up: a peer is silent only after as long as presence may
        # take to come at all (``silent``), so a new job's first plans are waited for as before.
        self.since = port.clock.now()

    def skipped(self, peer: str) -> bool:
        """Whether ``peer`` will not plan its attempt, as far as this node can tell: it is down
        or unknown, it does not take part, it is behind NAT while a reachable candidate is up,
        it said it passes this round's turns (it was still preparing when a peer was ready, or
        it skips its own turns: ``passes_own_turns``) while a candidate that did not is up, or
        (in a time-budgeted job) the last result records it as slow while a faster one is up.
        Each of these is a fact every node learns alike (health aside), so the node itself
        skips the same attempts its peers skip."""
        book, port = self.book, self.port
        if peer == book.me:
            up = book.participates()
        else:  # a peer whose job failed plans nothing, whatever its health
            health = port.health(peer)
            # One this node keeps no record of (a large mesh's peer table holds a bounded few)
            # is up while its presence is fresh here: skipped, its turn was planned twice.
            up = health != PeerState.DOWN and peer not in book.left \
                and (health is not None or heard_lately(book, peer))
        if not up:
            return True
        slow = self.slow_by_ledger()
        passing = book.passing_now()
        if not port.behind_nat(peer) and peer not in slow and peer not in passing:
            return False  # the common case, asked at every presence: no walk of the peer table
        # A private candidate is skipped for any reachable one; a slow one for any reachable one
        # that is not slow; one that passes its turns for any reachable one that does not.
        shunned = port.private_peers()
        if peer in slow:
            shunned |= slow
        if peer in passing:
            shunned |= passing
        others = [p for p in book.eligible() if p not in shunned
                  and (p == book.me or port.health(p) not in (None, PeerState.DOWN))]
        return bool(others)

    def slow_by_ledger(self) -> set[str]:
        """In a time-budgeted job, the members much slower than the fastest by the throughputs
        the last committed result records (``workplan.slow_members``). Every node with that
        ledger computes the same set, so they all pass the same attempts without a message: a
        slow coordinator, as the round's root, would hold every round it roots."""
        book = self.book
        if not book.spec.uses_budget or not book.ledger.results:
            return set()
        return slow_members(recorded_rates(book.ledger.results[-1].contributors))

    def passes_own_turns(self) -> bool:
        """Whether this node plans none of the current round's attempts although it is up: it
        is an eligible candidate that skips its own turns (behind NAT, or slow by the ledger,
        while a reachable candidate is up). Its presence says so (``passes``), so peers skip
        its turns at once on its own signed word: a peer that has not yet learnt it is behind
        NAT (a NodeInfo older than its reachability) otherwise waits a plan timeout for a
        turn nobody plans, and a public node's plan for a later attempt stays held meanwhile.
        Only this node can say it passes its turns, so no later candidate pre-empts it."""
        book = self.book
        return book.me in book.eligible() and book.participates() and self.skipped(book.me)

    def silent(self, peer: str) -> bool:
        """Whether ``peer`` (not this node) has sent this node no presence of the job within
        ``PRESENCE_FRESH_S``: it is no live member here (``JobBook.live_members``) either. Never
        in the first ``PRESENCE_FRESH_S`` after this node took the job up: a peer not heard yet
        then may just not have spoken yet, and a later candidate would pre-empt it."""
        if peer == self.book.me:
            return False
        return self.port.clock.now() - max(self.since, self.book.presence.get(peer, -math.inf)) > PRESENCE_FRESH_S

    def passed_over(self, peer: str, rs: RoundState, attempt: int) -> bool:
        """Whether ``peer``'s turn (``attempt``) gives way to a plan this node holds for a later
        attempt: ``peer`` is silent here. Its presence (which would say whether it passes its
        turns) does not reach this node, and a valid plan for a later attempt is in hand, so
        this node does not wait a plan timeout on a candidate it cannot hear. A candidate this
        node hears is waited for as before, so a later candidate pre-empts no earlier one that
        is live here; one it cannot hear could not have had this node's update anyway."""
        return any(a > attempt for a in rs.held) and self.silent(peer)

    def attempt_skipped(self, attempt: int) -> bool:
        cand = self.book.expected_coordinator(attempt)
        return cand is None or self.skipped(cand)

    def next_turn(self, attempt: int) -> int | None:
        """The first attempt from ``attempt`` on whose peer may plan; None if, in a whole turn
        of the ranking, none may (all down)."""
        for a in range(attempt, attempt + max(1, len(self.book.eligible()))):
            if not self.attempt_skipped(a):
                return a
        return None
