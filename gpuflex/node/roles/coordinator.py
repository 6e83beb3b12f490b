"""The coordinator's side of a round: obtain the plan, and make it when this node's turn comes.

Every node computes the same ranking for round r (``ranking.coordinator_ranking`` over the
eligible members the ledger names), and each attempt belongs to exactly one peer: the ranking
rotated by the attempt (``JobBook.expected_coordinator``). A node waits one plan timeout for
the live peer whose attempt it is, skips at once an attempt whose peer is down (or behind NAT
while a reachable one is up), and plans itself when the attempt is its own.

A received plan is accepted only if it extends this node's ledger, comes from the peer its
attempt belongs to, keeps to the job's allowlist, deadlines and sample cap, and (under secure
aggregation) groups its members as public randomness says. A plan for a later attempt never
displaces the plan in force: it is held until this node gives up the current attempt itself,
so nobody pre-empts a live coordinator by naming a larger attempt. A candidate that skips its own
turns says so in its presence (``Turns.passes_own_turns``): peers that cannot tell it is behind NAT
then skip its turn on its signed word, and go on to the held plan without a plan timeout. With
a later plan held, a turn whose candidate this node has not heard for ``PRESENCE_FRESH_S`` gives
way to it at once (``Turns.passed_over``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from aggregation.errors import AggregationError
from aggregation.tree import build_tree, depth
from gpuflex.node.core.evidence import cap_from
from gpuflex.node.core.kinds import EventKind, Phase
from gpuflex.node.core.messages import Plan, make_plan, parse_plan
from gpuflex.node.core.placement import cap_per_prefix, group_draw, masked_tree, order_for_tree
from gpuflex.node.core.workplan import (
    keep_earlier,
    plan_steps,
    slow_members,
    valid_rate,
)
from gpuflex.node.port import JobPort
from gpuflex.node.presence import PRESENCE_COORDINATORS  # the candidates presence goes to
from gpuflex.node.roles.plansahead import PlanAhead
from gpuflex.node.roles.turns import Turns, heard_lately, last_contributors, plannable
from gpuflex.node.state import PRESENCE_FRESH_S, JobBook, RoundDeadlines, RoundState
from mesh.codec import WireError, WireReason
from mesh.health import PeerState
from mesh.messaging import Inbound, Rejected

log = logging.getLogger("gpuflex.coordinator")
#: A coordinator waits this long for min_nodes members to be reachable before giving up its turn.
MIN_NODES_WAIT_S = 60.0
#: A plan that arrives before this node has prepared the job waits this long for it.
READY_WAIT_S = 30.0
#: A plan may arrive while the previous round's result is still being applied here (a model
#: download): it waits this long for the ledger to catch up, then is held (``plansahead``).
PREVIOUS_ROUND_WAIT_S = 15.0
#: Before it plans, a coordinator gives the members it knows only by hearsay (never heard by
#: this node) this long to speak, then pings at most so many of those still silent, for at most
#: so long: those that answer are planned; a key nothing answers for is not. It waits up to the
#: fourth figure more while more are silent than it would ping (1,000 simulated nodes: 324 of
#: round 1's contributors were still applying its model 1.5 s in; round 2 planned 666 of 991).
SPEAK_WAIT_S, REACH_AT_ONCE, REACH_TIMEOUT_S, SPEAK_WAIT_MORE_S = 1.5, 64, 2.0, 4.0
#: A plan's group tree may be at most this deep (groups of two hold 4,096 members at 12).
MAX_TREE_DEPTH = 12

#: Starts this node's roles in a plan now in force (the driver's ``_start_roles``).
StartRoles = Callable[[Plan, RoundDeadlines], None]


class Coordinator:
    def __init__(self, port: JobPort, book: JobBook, own_samples: Callable[[], int] = lambda: 0,
                 start_roles: StartRoles = lambda plan, deadlines: None) -> None:
        self.port, self.book = port, book
        self._own_samples, self._start_roles = own_samples, start_roles
        self.turns = Turns(port, book)

    # -- obtaining the plan ------------------------------------------------------------------

    async def obtain_plan(self, rs: RoundState) -> Plan | None:
        """The plan in force for ``rs.attempt`` or later: this node's own on its turn, else the
        one the attempt's peer sends within a plan timeout. None: the driver moves on."""
        book, clock, spec = self.book, self.port.clock, self.book.spec

        def settled() -> bool:
            return rs.has_plan() or book.round_over(rs) or self._activate_held(rs)

        await self._hear_candidates(rs, settled)
        # At most one pass per candidate: a turn skipped while a later attempt's plan is held
        # goes on to the next turn here, not after the driver's pause between attempts.
        for _ in range(max(1, len(book.eligible()))):
            if settled():
                break
            turn = self.turns.next_turn(rs.attempt)
            if turn is None:
                # Nobody to wait for (every candidate is down, or this node, back from a restart,
                # was not in the last plan): give the mesh one plan timeout to change. Retrying at
                # once instead spun the driver at full CPU.
                await book.changed.wait_for(settled, clock.now() + spec.plan_timeout)
                break
            rs.begin_attempt(turn)
            if settled():
                break
            cand = book.expected_coordinator(turn)
            assert cand is not None  # _next_turn found one
            if cand == book.me:
                await self.coordinate(rs)
                break
            if not self.turns.passed_over(cand, rs, turn):
                await self._await_turn(cand, settled, rs, turn)
            if settled() or not any(a > turn for a in rs.held):
                break
            if self.turns.passed_over(cand, rs, turn):
                log.info("round %d: attempt %d's coordinator %s has not been heard here for %.0fs: on to the "
                         "plan held for attempt %d", rs.round, turn, cand[-8:], PRESENCE_FRESH_S,
                         min(a for a in rs.held if a > turn))
            elif not self.turns.skipped(cand):
                break
            rs.begin_attempt(turn + 1)  # its candidate passes: on to the held plan's attempt
        return rs.plan if rs.has_plan() else None

    async def _hear_candidates(self, rs: RoundState, settled: Callable[[], bool]) -> None:
        """Give the round's first candidates (round 1: of the job's named members; later: of the last
        round's contributors) this node has no record of ``SPEAK_WAIT_S`` to be heard before their
        turns are judged (``Turns.skipped`` skips an unknown one). In a large mesh a node keeps no
        record of most peers; judged before a candidate's presence came, a later candidate skipped
        an earlier one that was planning, and two plans split the round."""
        book, port = self.book, self.port
        recent = (last_contributors(book) if book.ledger.results else set(book.info.initial_members)) - {book.me}
        # Ranked once (a ranking hashes every eligible member; the wait wakes on each presence).
        ranked = (book.expected_coordinator(a) for a in range(rs.attempt, rs.attempt + PRESENCE_COORDINATORS))
        cands = [c for c in ranked if c is not None and c in recent]

        def unknown() -> list[str]:  # no record here, and no presence lately (``heard_lately``)
            return [c for c in cands if port.health(c) is None and not heard_lately(book, c)]

        if unknown():
            await book.changed.wait_for(lambda: not unknown() or settled(), port.clock.now() + SPEAK_WAIT_S)

    async def _await_turn(self, cand: str, settled: Callable[[], bool], rs: RoundState, turn: int) -> None:
        """Wait one plan timeout for ``cand``'s plan, or until it is settled, ``cand`` is
        skipped, or (a later plan held) ``cand`` falls silent here."""
        book, clock = self.book, self.port.clock
        until = clock.now() + book.spec.plan_timeout

        def done() -> bool:
            return settled() or self.turns.skipped(cand) or self.turns.passed_over(cand, rs, turn)

        # Silence is a matter of time, not of a change: look again once it would set in.
        quiet_at = max(self.turns.since, book.presence.get(cand, -math.inf)) + PRESENCE_FRESH_S  # trio's clock too
        if quiet_at < until and await book.changed.wait_for(done, quiet_at):
            return
        await book.changed.wait_for(done, until)

    def _take_up_behind(self, rs: RoundState) -> bool:
        """Put in force a plan for an earlier attempt that came while this node was busy."""
        plan = rs.take_behind()
        if plan is None or plan.round != rs.round or plan.attempt >= rs.attempt or plan.attempt in rs.aborted \
                or self.book.committed >= plan.round or rs.has_plan():
            return False
        try:
            deadlines = self._deadlines(plan)
        except WireError:  # its deadline passed meanwhile
            return False
        self._in_force(rs, plan, deadlines, take_up=True)
        self._start_roles(plan, deadlines)
        return True

    def _activate_held(self, rs: RoundState) -> bool:
        """Put in force a plan held for the attempt this node has now reached."""
        if self._take_up_behind(rs):
            return True
        plan = rs.take_held()
        if plan is None or self.book.committed >= plan.round or plan.round != rs.round or plan.attempt in rs.aborted:
            return False
        if rs.plan is not None and rs.plan.attempt >= plan.attempt:
            return False
        try:
            deadlines = self._deadlines(plan)
        except WireError:  # its deadline passed while it was held
            return False
        self._in_force(rs, plan, deadlines)
        self._start_roles(plan, deadlines)
        return True

    # -- making a plan -----------------------------------------------------------------------

    async def coordinate(self, rs: RoundState) -> Plan | None:
        """Make and gossip the plan for ``rs``'s attempt, this node's turn: wait (bounded) for
        enough live members. The turn is given way if, meanwhile, this node went back to an
        earlier attempt its peers are in (their plan reached it): its peers may disagree about
        who passes a turn, and the plan in force settles it."""
        book, port = self.book, self.port
        spec, attempt = book.spec, rs.attempt
        until = port.clock.now() + MIN_NODES_WAIT_S
        # A masked round needs a leader and secagg_min_group masking members in some group.
        need = max(spec.min_nodes, spec.secagg_min_group + 1 if spec.secure_aggregation else 1)

        def measured() -> list[str]:
            live = book.live_members(plannable(port, book))
            if spec.uses_budget:
                # A member is planned once it has published its throughput: its step count
                # comes from it. One still loading its data joins the next round; planned
                # blind, it was given the slowest member's count and idled most of the budget.
                live = [p for p in live if p == book.me or valid_rate(book.rates.get(p)) is not None]
            return live

        def members() -> list[str]:
            kept, _ = cap_per_prefix(measured(), port.peer_ip, spec.max_per_prefix, {book.me, *book.eligible()})
            return kept

        def gave_way() -> bool:  # caught up, another attempt's plan is in force or came while members were missing
            return book.round_over(rs) or rs.attempt != attempt or rs.has_plan() or any(a > attempt for a in rs.held)

        def enough(live: list[str]) -> bool:  # min_nodes, and (open jobs) most of the last round's contributors
            kept, needed = book.ledger.rules.continuing(book.ledger.results, live)
            return len(live) >= need and kept >= needed

        book.status.set_phase(Phase.PLAN)
        log.info("round %d: attempt %d is this node's turn to plan (%d members needed)", rs.round, rs.attempt, need)
        await self._reach_unheard()
        await book.changed.wait_for(lambda: enough(members()) or gave_way(), until)
        if gave_way():
            return None
        live = members()
        if not enough(live):
            kept, needed = book.ledger.rules.continuing(book.ledger.results, live)
            gone = "".join(f"; the job failed on {p[-8:]}: {why}" for p, why in sorted(book.left.items())[:4])
            port.emit(EventKind.ROUND_WAITING, rs.round, message=(
                f"round {rs.round}: only {len(live)} of {need} members needed are reachable"
                + (" and have published their throughput" if spec.uses_budget else "")
                + (f", {kept} of the {needed} recent contributors an open job needs" if kept < needed else "")
                + f"; not planning{gone}"))
            return None
        unmeasured = sorted(set(book.live_members(plannable(port, book))) - set(measured()))
        if unmeasured:
            log.info("round %d: %d member(s) that have not published their throughput yet join a later round: %s",
                     rs.round, len(unmeasured), ", ".join(p[-8:] for p in unmeasured[:8]))
        dropped = sorted(set(measured()) - set(live))
        if dropped:
            log.warning("round %d: left out %d member(s) beyond max_per_prefix=%d per network: %s", rs.round,
                        len(dropped), spec.max_per_prefix, ", ".join(p[-8:] for p in dropped[:8]))
        homes = port.private_peers() & set(live)
        # In a mesh with homes in it, a member whose reachability is not known here is listed
        # as private (its children fetch the model from public nodes) and leads only after the
        # reachable and the hole-punched: taken for reachable, homes led groups nobody could
        # dial, or served the model down a home uplink (100 simulated nodes, 10 % public).
        unsure = port.reach_unknown(live) if homes else set()
        private = sorted(homes | unsure)
        parent = self._tree(live, private, unsure)
        train_by = port.clock.now() + spec.train_budget(book.recent_durations())
        cap = book.ledger.rules.sample_cap(book.ledger.results)
        work: dict[str, object] = {}
        if spec.uses_budget:  # each member's steps from its published throughput
            counts = plan_steps(list(parent), book.rates, spec.compute_budget_s, spec.batch_size, spec.local_steps)
            earlier = [c.plan for c in rs.collectors.values()] + ([rs.plan] if rs.plan is not None else [])
            work = {"budget_s": spec.compute_budget_s,
                    "steps": keep_earlier(counts, [p for p in earlier if p.round == rs.round], book.head_model)}
        frame = make_plan(
            port.identity, job=book.job_id, round=rs.round, attempt=attempt, coordinator=book.me,
            base_hash=book.head_model, prev_result=book.ledger.head, members=list(parent), parent=parent,
            train_deadline=port.clock.to_wire(train_by), reduce_slack_s=spec.reduce_slack,
            sample_cap=cap if cap is not None else cap_from(spec.sample_cap_factor, [self._own_samples()]),
            private=private, **work,
        )
        try:
            await port.broadcast(frame)  # applied here first: it is in force unless a better one is
        except WireError as exc:  # refused by this node's own check: it never leaves this node
            log.warning("round %d: this node's own plan for attempt %d was not applied: %s", rs.round, attempt, exc)
            return None
        return rs.plan

    def _unheard(self) -> list[str]:
        """The members a plan would include if hearsay counted (up by another peer's word, never
        heard by this node nor contributors of the last round; ``plannable``), and the last
        round's contributors it has no record of yet (a large mesh's node keeps none of most
        peers, ``MeshNode.keep_set``): each proved itself live a round ago, and its presence to
        a new coordinator is on its way."""
        book, port = self.book, self.port
        heard = set(plannable(port, book))
        known = set(book.presence) | set(book.info.initial_members) | set(book.eligible())
        up = [p for p in known if p not in heard and p != book.me and port.health(p) == PeerState.UP]
        unknown = {p for p in last_contributors(book) - heard - {book.me} - set(book.left) if port.health(p) is None}
        return sorted({p for p in book.live_members(up) if p != book.me} | unknown)

    async def _reach_unheard(self) -> None:
        """Give the members this node knows only by hearsay ``SPEAK_WAIT_S`` to speak (a new
        job's members send their first presence within a moment; ``SPEAK_WAIT_MORE_S`` more
        while more than ``REACH_AT_ONCE`` are silent), then ping those still silent, at most
        ``REACH_AT_ONCE``: those that answer are planned like any member. A member whose first
        word is on its way is not left out for that; a key nothing answers for costs these waits."""
        book, port = self.book, self.port
        if not self._unheard():
            return
        until = port.clock.now() + SPEAK_WAIT_S
        await book.changed.wait_for(lambda: not self._unheard(), until)
        await book.changed.wait_for(lambda: len(self._unheard()) <= REACH_AT_ONCE, until + SPEAK_WAIT_MORE_S)
        unheard = self._unheard()[:REACH_AT_ONCE]
        if unheard:
            with trio.move_on_after(REACH_TIMEOUT_S):
                await port.reach(unheard)
            answered = set(unheard) & set(port.heard_peers())
            log.info("pinged %d member(s) known only by hearsay before planning: %d answered%s", len(unheard),
                     len(answered), "".join(f"; {p[-8:]} did not" for p in sorted(set(unheard) - answered)[:4]))

    def _draw(self, round_: int) -> tuple[bytes, frozenset[str] | None]:
        """The seed of a masked round's groups, from the nonces the last result reveals, and
        the members it places (``placement.group_draw``); the ledger is the plan's."""
        results = self.book.ledger.results
        return group_draw(self.book.job_id, round_, results[-1].contributors if results else [],
                          results[-2].contributors if len(results) > 1 else [])

    def _tree(self, live: list[str], private: list[str], unsure: set[str]) -> dict[str, str | None]:
        book, spec = self.book, self.book.spec
        if spec.secure_aggregation:
            seed, placed = self._draw(book.current.round)
            return masked_tree(book.me, live, private, spec.group_size, spec.secagg_min_group, seed, placed)
        slow = slow_members({p: book.rates.get(p) for p in live}) if spec.uses_budget else set()
        ordered, group_size = order_for_tree(book.me, live, private, spec.group_size, slow,
                                             punched=self.port.punched_peers(), coords=self.port.coordinates(),
                                             unsure=unsure)
        flat = spec.aggregation_mode == "flat-robust"  # leaders only forward: the root sees all
        return build_tree(ordered, max(2, len(ordered)) if flat else group_size, book.me)

    # -- a plan from a peer ------------------------------------------------------------------

    def _deadlines(self, plan: Plan) -> RoundDeadlines:
        """The plan's deadlines on this node's clock, within the job's limits (WireError if not)."""
        book, clock = self.book, self.port.clock
        train = clock.bounded_local(plan.train_deadline, book.spec.train_budget(book.recent_durations()),
                                    "the plan's training deadline")
        slack = clock.bounded_span(plan.reduce_slack_s, book.spec.reduce_slack, "the plan's reduce slack")
        return RoundDeadlines(train=train, slack=slack, members=len(plan.members), received=clock.now())

    def _check(self, plan: Plan) -> None:
        """WireError (penalised) unless ``plan`` is one this job's rules allow."""
        book, spec = self.book, self.book.spec
        rules = book.ledger.rules
        expected = book.expected_coordinator(plan.attempt)
        if plan.coordinator != expected:
            raise WireError(WireReason.ROUND, f"plan from {plan.coordinator[-8:]} for attempt {plan.attempt}, which "
                                     f"belongs to {expected[-8:] if expected else 'nobody'}")
        if not all(rules.allowed(p) for p in plan.members):
            raise WireError(WireReason.ROUND, "plan names members outside the job's allowlist")
        try:
            levels = depth(plan.parent)
        except AggregationError as exc:
            raise WireError(WireReason.GARBLED, f"plan tree: {exc}") from None
        if levels > MAX_TREE_DEPTH:
            raise WireError(WireReason.ROUND, f"plan tree is {levels} levels deep (at most {MAX_TREE_DEPTH})")
        cap = rules.sample_cap(book.ledger.results)
        if cap is not None and plan.sample_cap != cap:
            raise WireError(WireReason.ROUND, f"plan caps samples at {plan.sample_cap}, the ledger implies {cap}")
        budget = spec.compute_budget_s if spec.uses_budget else 0.0
        if plan.budget_s != budget or (spec.local_steps and max(plan.steps.values(), default=0) > spec.local_steps):
            raise WireError(WireReason.ROUND, f"plan's compute budget ({plan.budget_s:g}s) or step counts are not "
                                     f"the job's ({budget:g}s, local_steps={spec.local_steps})")
        if spec.secure_aggregation:
            seed, placed = self._draw(plan.round)
            fair = masked_tree(plan.coordinator, plan.members, plan.private, spec.group_size,
                               spec.secagg_min_group, seed, placed)
            if dict(plan.parent) != fair:
                raise WireError(WireReason.ROUND, f"plan from {plan.coordinator[-8:]} chose its own secure-aggregation "
                                         "groups instead of those public randomness gives")

    async def accept(self, msg: Inbound) -> tuple[Plan, RoundDeadlines]:
        """Check a received plan and make it the one in force; Rejected or WireError if not."""
        book = self.book
        plan = parse_plan(msg.envelope)
        with trio.move_on_after(READY_WAIT_S):
            await book.ready.wait()
        # The previous round's result may still be being applied here (model download).
        await book.changed.wait_for(lambda: book.committed >= plan.round - 1,
                                    self.port.clock.now() + PREVIOUS_ROUND_WAIT_S)
        rs, r = book.current, book.current.round
        if plan.round == r + 1:  # still applying round r's result here: held, not refused
            raise PlanAhead(plan, self._deadlines(plan).train)
        if plan.round != r or plan.prev_result != book.ledger.head or plan.base_hash != book.head_model:
            raise Rejected(f"plan for round {plan.round} does not extend this node's ledger at round {r - 1}")
        self._check(plan)
        deadlines = self._deadlines(plan)
        current = rs.plan
        reached = max(rs.attempt, current.attempt if current is not None else 0)
        if current is not None and current.digest == plan.digest:
            raise Rejected("this plan is already in force")
        if current is not None and plan.attempt == current.attempt:
            raise Rejected(f"plan for attempt {plan.attempt}; this node is at attempt {reached}")
        if plan.attempt < reached:
            waiting = current is None or current.attempt < rs.attempt  # no plan in force here
            if plan.attempt in rs.aborted or not waiting:
                rs.keep_behind(plan)  # unless its attempt was aborted, or a later one is kept
                raise Rejected(f"plan for attempt {plan.attempt}; this node is at attempt {reached}")
            # This node passed that attempt waiting for its plan, and has none in force now: its
            # peers are in that attempt, so take it up rather than run ahead of them alone.
            self._in_force(rs, plan, deadlines, take_up=True)
            return plan, deadlines
        live = current is not None and current.attempt >= rs.attempt  # not an attempt given up here

        def waited_for(a: int) -> bool:  # a turn before this plan's that this node waits out
            cand = book.expected_coordinator(a)
            return not self.turns.attempt_skipped(a) and not (cand is not None and self.turns.silent(cand))

        if live or any(waited_for(a) for a in range(reached, min(plan.attempt, reached + len(book.eligible())))):
            # A live peer's attempt comes first here: keep this plan until this node gives that up.
            rs.hold(plan)
            book.changed.notify()
            raise Rejected(f"plan for attempt {plan.attempt} held: attempt {reached} is not over here")
        self._in_force(rs, plan, deadlines)
        return plan, deadlines

    def _in_force(self, rs: RoundState, plan: Plan, deadlines: RoundDeadlines, *, take_up: bool = False) -> None:
        """Record ``plan`` in force (``take_up``: going back to its attempt) and say so."""
        if take_up:
            rs.take_up(plan, deadlines)
        else:
            rs.put_in_force(plan, deadlines)
        self.port.emit(EventKind.PLAN_RECEIVED, rs.round, plan.coordinator, message=(
            f"round {rs.round}: plan from {plan.coordinator[-8:]} for attempt {plan.attempt} "
            f"with {len(plan.members)} members"))
        self.book.changed.notify()
