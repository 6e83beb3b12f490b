"""What makes a committed round count: the evidence every node checks before it appends a
result, whether the result arrived by gossip or inside a ledger from catch-up sync.

A result counts only if
  - its plan is signed by the one coordinator the ranking names for that plan's attempt
    (``expected_coordinator``: rendezvous ranking over the job's eligible members, which come
    from the ledger itself, so every node and an offline audit compute the same name; round
    1's puts the job's owner ahead), and
    the plan extends the previous result (its hash, its model);
  - it counts at least ``min_nodes`` contributions, each a valid signed update made for that
    very plan (the update signs the plan's digest) by one of the plan's members, on its base;
  - its contributor list and its ``contributors`` metric say exactly that (so the list's
    length, the round's weight in fork choice, ``forkchoice.round_weight``, is the verified
    count), each row's step count is its signed update's, and no update took more steps than a
    budgeted plan allowed;
  - in an allowlisted job, the plan's coordinator and members are all on the allowlist;
  - in an open job, from round 2 on, more than half of the members that contributed to either
    of the two previous rounds contributed to it too (``ChainRules.continuing``): keys new to
    the job, however many sit in a committed plan, cannot commit a round without the members
    that were already there;
  - from round 2 on, the plan's sample cap is the one the previous round implies.

Nothing in this list can be ground or claimed: the attempt picks the coordinator instead of
ranking results, nonces and encodings do not change a digest (``mesh.codec``), and a claim to
be ahead needs a ledger whose every round passes the same checks.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuflex.errors import GpuflexError
from gpuflex.node.core.messages import MAX_SAMPLES, Result, Update, walk_contributions
from gpuflex.node.core.ranking import coordinator_ranking
from gpuflex.node.core.workfields import nonce_fields
from mesh.codec import WireError

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec


#: An open job's round needs most of the members that contributed to this many previous rounds.
QUORUM_ROUNDS = 2


class EvidenceError(GpuflexError, ValueError):
    """A round's evidence does not hold; the message names the round and what is missing."""


@dataclass(frozen=True)
class ChainRules:
    """What a job's ledger is checked against: fixed when the job arrives.

    ``initial_members`` None means the job's member list is unknown (an offline audit of a
    ledger file alone): round 1's coordinator is then not checked; every later round is, as
    its eligible members come from the ledger."""

    job: str
    initial_members: tuple[str, ...] | None = None
    allowlist: tuple[str, ...] = ()
    min_nodes: int = 1
    sample_cap_factor: float | None = None  # None: unknown (an audit without the job spec)
    max_samples: int = 0
    owner: str | None = None  # who signed the job: round 1's first candidate if eligible
    # An open job (no allowlist): each round needs most of the recent rounds' contributors.
    quorum: bool = False
    # The eligible members as of the last result seen (its digest): asked at every presence,
    # quorum check and incoming update, and a sort of every member each time.
    _eligible: dict[str | None, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)
    # The candidates in attempt order, as of the same last result: a rendezvous ranking (a hash
    # per member), asked at every presence and turn; every attempt's coordinator is read off it.
    _order: dict[str | None, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def for_job(cls, job: str, spec: JobSpec, initial_members: Sequence[str], owner: str | None = None) -> ChainRules:
        return cls(job=job, initial_members=tuple(sorted(initial_members)), allowlist=tuple(spec.allowlist),
                   min_nodes=spec.min_nodes, sample_cap_factor=spec.sample_cap_factor,
                   max_samples=spec.max_samples, owner=owner, quorum=not spec.allowlist)

    def allowed(self, peer: str) -> bool:
        return not self.allowlist or peer in self.allowlist

    def continuing(self, history: Sequence[Result], peers: Collection[str]) -> tuple[int, int]:
        """(how many of the recent contributors ``peers`` holds, how many the next round needs):
        in an open job, from round 2 on, more than half of the members that contributed to any
        of the last ``QUORUM_ROUNDS`` rounds; (0, 0) otherwise.

        Why: in an open job anyone may bring keys, and a plan includes every live member, so a
        party's keys reach a committed plan and, with it, turns to coordinate. A round that
        needed only ``min_nodes`` of any members let those keys alone commit the next rounds on
        their own attempts, and every honest node took them. Counting the members that did the
        recent rounds' work instead bounds such a party by the honest contributors: with fewer
        keys than they have, it commits nothing without them. Two rounds, not one: a party
        that roots one round may leave honest updates out of it, and would need only most of
        that shrunken set for the next; over two, the next round still needs the members it
        left out, and no honest member signs an update for a branch it does not hold."""
        if not self.quorum or not history:
            return 0, 0
        before = {c.get("peer") for r in history[-QUORUM_ROUNDS:] for c in r.contributors}
        return len(before & set(peers)), len(before) // 2 + 1

    def eligible(self, history: Sequence[Result]) -> list[str]:
        """Who may coordinate the next round: the last committed plan's members (the job's
        initial members before any), within the allowlist. Presence alone never adds anyone."""
        key = history[-1].digest if history else None
        cached = self._eligible.get(key)
        if cached is None:
            members = history[-1].plan.members if history else (self.initial_members or ())
            cached = tuple(sorted(p for p in members if self.allowed(p)))
            self._eligible.clear()
            self._eligible[key] = cached
        return list(cached)

    def _order_of(self, history: Sequence[Result]) -> tuple[str, ...]:
        key = history[-1].digest if history else None
        cached = self._order.get(key)
        if cached is None:
            cached = tuple(coordinator_ranking(self.job, len(history) + 1, self.eligible(history),
                                               [r.coordinator for r in history], 0,
                                               first=None if history else self.owner))
            self._order.clear()
            self._order[key] = cached
        return cached

    def coordinator_order(self, history: Sequence[Result]) -> list[str]:
        """The next round's candidates in attempt order, from one ranking: attempt ``a``'s
        coordinator is the ``a``-th, modulo their number (``expected_coordinator``). A node
        that looks past the attempts that will be skipped reads this, not one attempt at a time."""
        return list(self._order_of(history))

    def expected_coordinator(self, history: Sequence[Result], attempt: int) -> str | None:
        """The one peer whose plan counts for the next round's ``attempt``; None if nobody is
        eligible. Each attempt rotates the ranking by one (``coordinator_ranking``), so a backup
        takes over by taking the next attempt, and nobody can pick the attempt that names it."""
        order = self._order_of(history)
        return order[attempt % len(order)] if order else None

    def sample_cap(self, history: Sequence[Result]) -> int | None:
        """The sample cap the next round's plan must carry; None when the coordinator picks it
        (round 1 of a job without ``max_samples``: no committed weights to take a median of)."""
        if self.max_samples:
            return self.max_samples
        if self.sample_cap_factor is None or not history:
            return None
        if self.sample_cap_factor <= 0:
            return 0
        weights = [c.get("samples") for c in history[-1].contributors]
        valid = [w for w in weights if isinstance(w, int) and not isinstance(w, bool) and w > 0]
        return cap_from(self.sample_cap_factor, valid)


def cap_from(factor: float, weights: Sequence[int]) -> int:
    """``factor`` times the median weight, at least 1 (0 when there are no weights: no cap)."""
    if not weights:
        return 0
    return max(1, min(MAX_SAMPLES, math.ceil(factor * statistics.median(weights))))


def verify_round(res: Result, history: Sequence[Result], rules: ChainRules) -> list[Update]:
    """Check ``res`` as the round after ``history`` (already verified); its counted updates.

    Raises EvidenceError naming the round and the first thing that does not hold."""
    i = len(history) + 1

    def fail(reason: str) -> EvidenceError:
        return EvidenceError(f"round {i}: {reason}")

    try:
        plan = res.plan
    except WireError as exc:
        raise fail(f"its plan does not verify ({exc})") from None
    prev = history[-1] if history else None
    if res.job != rules.job or plan.job != rules.job:
        raise fail(f"belongs to job {res.job}, not {rules.job}")
    if res.round != i or plan.round != i:
        raise fail(f"entry says round {res.round} (a round is missing or repeated)")
    if res.prev_result != (prev.digest if prev else "") or plan.prev_result != res.prev_result:
        raise fail("hash link to the previous result is broken")
    if plan.coordinator != res.coordinator or plan.attempt != res.attempt or plan.base_hash != res.base_hash:
        raise fail("the plan does not match the result")
    if prev is not None and plan.base_hash != prev.model_hash:
        raise fail("its plan does not start from the previous round's model")
    if not all(rules.allowed(p) for p in plan.members):
        raise fail("its plan names members outside the job's allowlist")
    if prev is not None or rules.initial_members is not None:
        expected = rules.expected_coordinator(history, plan.attempt)
        if plan.coordinator != expected:
            raise fail(f"plan signed by {plan.coordinator[-8:]}, but attempt {plan.attempt} belongs to "
                       f"{expected[-8:] if expected else 'nobody'}")
    cap = rules.sample_cap(history)
    if cap is not None and plan.sample_cap != cap:
        raise fail(f"its plan caps samples at {plan.sample_cap}, the previous round implies {cap}")
    try:
        counted = walk_contributions(res.updates, res.partials, res.job, i, plan)
    except WireError as exc:
        raise fail(f"a contribution does not verify ({exc})") from None
    if any(u.base_hash != plan.base_hash for u in counted):
        raise fail("an update was trained from another base model")
    if not all(isinstance(c, dict) for c in res.contributors):
        raise fail("contributor list is garbled")
    listed = sorted(repr((c.get("peer"), c.get("samples"), c.get("delta_hash"))) for c in res.contributors)
    if listed != sorted(repr((u.peer, u.samples, u.delta_hash)) for u in counted):
        raise fail("contributor list does not match the signed updates")
    # A time-budgeted round's step counts weigh each update (FedNova): a contributor row says
    # what its signed update says, and no update claims more steps than its plan allowed.
    rows = {c.get("peer"): c for c in res.contributors}
    if any("steps" in rows[u.peer] and rows[u.peer]["steps"] != u.steps for u in counted):
        raise fail("a contributor's step count differs from its signed update's")
    # Secure aggregation: a row's nonce and commitment are its signed update's (they draw groups).
    if any({k: rows[u.peer][k] for k in ("nonce", "commit") if k in rows[u.peer]} != nonce_fields(u.env.body)
           for u in counted):
        raise fail("a contributor's nonce or commitment differs from its signed update's")
    if plan.budget_s > 0 and any(u.steps > plan.steps.get(u.peer, u.steps) for u in counted):
        raise fail("an update claims more local steps than its plan allowed")
    if len(counted) < rules.min_nodes:
        raise fail(f"{len(counted)} verified contributions < min_nodes={rules.min_nodes}")
    kept, need = rules.continuing(history, {u.peer for u in counted})
    if kept < need:
        raise fail(f"{kept} of the recent rounds' contributors contributed; an open job needs {need}, "
                   "more than half")
    claimed = res.metrics.get("contributors")
    if claimed != len(counted):
        raise fail(f"claims {claimed!r} contributors, {len(counted)} signed updates are present")
    return counted
