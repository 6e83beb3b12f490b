"""One job's protocol state on one node, with no I/O: the round being worked on and the job
book every role reads and updates.

The current round is named here once (``RoundState.round``), and replaced by a fresh
``RoundState`` when the ledger grows, so nothing re-derives it from the ledger's length.
Deadlines are trio times (see ``gpuflex.node.clock``); waiting is on a change notifier, not
on polling.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import trio

from gpuflex.node.clock import Notifier
from gpuflex.node.core.evidence import ChainRules
from gpuflex.node.core.kinds import JobState
from gpuflex.node.core.ledger import Ledger
from gpuflex.node.core.messages import Plan
from gpuflex.node.core.workfields import WireValue
from gpuflex.node.status import StatusRecord

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec
    from gpuflex.node.collector import Collector

#: A peer whose presence is older than this is no longer counted as taking part.
PRESENCE_FRESH_S = 10.0
#: After the last tree level's reduce slack, a round still gets this long before it is given up.
ROUND_END_MARGIN_S = 10.0
#: Tree levels budgeted beyond the members' count when a round's end is set (root and slack).
ROUND_END_EXTRA_LEVELS = 2
#: A round's end counts at most this many levels, however many members a plan lists: a plan
#: of thousands of names must not hold a round open for hours.
ROUND_END_MAX_LEVELS = 16
#: Plans held for attempts this node has not reached yet (one per attempt, the lowest kept).
MAX_HELD_PLANS = 8
#: Peers whose presence one job remembers; past it, stale entries are forgotten first.
MAX_PRESENCE = 4096
#: An update or partial payload may hold this many bytes per model parameter (top-k at its
#: densest sends a value and an index for each) ...
PAYLOAD_BYTES_PER_PARAM = 8
#: ... plus this much for its headers and, under secure aggregation, its encrypted seed shares.
PAYLOAD_SLACK = 4 << 20


@dataclass(frozen=True)
class JobInfo:
    """What a job is: fixed when it arrives."""

    job_id: str
    spec: JobSpec
    initial_members: tuple[str, ...]
    frame: bytes  # the signed JobSpec envelope, as offered to peers on sync
    submitted_by: str

    def part_for(self, me: str) -> tuple[int, int]:
        """This node's (index, count) of the data split: its place among the initial
        members, or a stable hash of its id for a node that joined later."""
        if me in self.initial_members:
            return self.initial_members.index(me), len(self.initial_members)
        parts = max(1, len(self.initial_members))
        return int.from_bytes(hashlib.blake2b(me.encode(), digest_size=4).digest(), "big") % parts, parts


@dataclass(frozen=True)
class RoundDeadlines:
    """A plan's deadlines on this node's trio clock, converted once when the plan arrives."""

    train: float  # members should have sent their updates by then
    slack: float  # seconds per tree level to reduce after ``train``
    members: int
    # When this node took the plan up: a time-budgeted member's budget runs from here, so
    # the time it spent loading the model and its trainer counts against the budget too.
    received: float = 0.0

    def reduce_by(self, height: int) -> float:
        """When a tree node ``height`` levels above the leaves stops waiting for its children."""
        return self.train + height * self.slack

    @property
    def end(self) -> float:
        """After this the round is given up and retried."""
        levels = min(self.members, ROUND_END_MAX_LEVELS)
        return self.train + (levels + ROUND_END_EXTRA_LEVELS) * self.slack + ROUND_END_MARGIN_S


class RoundState:
    """The round this node works on: its number, the attempt, the plan in force and its
    deadlines, the attempts aborted, the plans kept for later, and this node's collectors.

    Everything that changes it happens through the transitions below; the fields are private.
    The roles decide (is a plan valid, whose turn is it); the state records, and keeps its
    invariant: every kept plan is for a live attempt of this round (``kept_plans_live``).
    """

    def __init__(self, round: int) -> None:
        self._round = round
        self._attempt = 0
        self._plan: Plan | None = None
        self._deadlines: RoundDeadlines | None = None
        self._aborted: set[int] = set()
        self._collectors: dict[int, Collector] = {}  # by attempt
        # Valid plans for attempts this node has not given up the current one for yet: a plan in
        # force is never displaced by a later attempt's (no one can pre-empt a live coordinator).
        self._held: dict[int, Plan] = {}
        # The latest valid plan for an attempt this node passed while waiting for it (it came
        # late, or while this node was busy with a later attempt): taken up when this node next
        # waits, so that a node that ran ahead on attempts comes back to the one its peers are in.
        self._behind: Plan | None = None

    # -- what it records (read-only views) ----------------------------------------------------
    # ``plan`` is the plan in force (for ``attempt``, or one taken up or given up); ``attempt``
    # the one this node works in or waits for; ``deadlines`` are set with ``plan``.

    @property
    def round(self) -> int: return self._round
    @property
    def attempt(self) -> int: return self._attempt
    @property
    def plan(self) -> Plan | None: return self._plan
    @property
    def deadlines(self) -> RoundDeadlines | None: return self._deadlines
    @property
    def behind(self) -> Plan | None: return self._behind
    @property
    def aborted(self) -> frozenset[int]: return frozenset(self._aborted)
    @property
    def held(self) -> Mapping[int, Plan]: return MappingProxyType(self._held)
    @property
    def collectors(self) -> Mapping[int, Collector]: return MappingProxyType(self._collectors)

    def in_force(self, plan: Plan) -> bool:
        """Whether ``plan`` is this round's plan in force and its attempt was not aborted."""
        return (plan.round == self._round and plan.attempt not in self._aborted
                and (self._plan is None or self._plan.attempt == plan.attempt))

    def has_plan(self) -> bool:
        """Whether a plan is in force for the current attempt or a later one."""
        return self._plan is not None and self._plan.attempt >= self._attempt

    def kept_plans_live(self) -> bool:
        """The postcondition of every transition: each kept plan is for this round, for an
        attempt nobody aborted, and at most ``MAX_HELD_PLANS`` are held."""
        kept = [*self._held.items(), *([(self._behind.attempt, self._behind)] if self._behind else [])]
        return len(self._held) <= MAX_HELD_PLANS and all(
            p.round == self._round and p.attempt == a and a not in self._aborted for a, p in kept)

    def _done(self) -> None:  # every transition's postcondition
        assert self.kept_plans_live(), f"round {self._round}: a kept plan is not live"

    # -- transitions --------------------------------------------------------------------------

    def begin_attempt(self, attempt: int) -> None:
        """Work in (or wait for) ``attempt`` from now on."""
        self._attempt = max(0, attempt)
        self._done()

    def put_in_force(self, plan: Plan, deadlines: RoundDeadlines) -> None:
        """Make ``plan`` the one in force, with its deadlines (the coordinator checked it)."""
        if plan.round != self._round:
            raise ValueError(f"plan for round {plan.round} put in force in round {self._round}")
        self._plan, self._deadlines = plan, deadlines
        self._done()

    def take_up(self, plan: Plan, deadlines: RoundDeadlines) -> None:
        """Go back to ``plan``'s attempt (passed here, its peers are in it) and put it in force."""
        self.begin_attempt(plan.attempt)
        self.put_in_force(plan, deadlines)

    def hold(self, plan: Plan) -> bool:
        """Keep ``plan`` until this node reaches its attempt; False if one is held for it
        already, its attempt was aborted, or it is not this round's."""
        if plan.attempt in self._held or plan.attempt in self._aborted or plan.round != self._round:
            return False
        self._held[plan.attempt] = plan
        for extra in sorted(self._held)[MAX_HELD_PLANS:]:
            del self._held[extra]
        self._done()
        return plan.attempt in self._held

    def keep_behind(self, plan: Plan) -> bool:
        """Keep ``plan`` (for an attempt passed here) to take up when this node next waits; only
        the latest such plan is kept. False if it is not kept."""
        if plan.attempt in self._aborted or plan.round != self._round \
                or (self._behind is not None and self._behind.attempt >= plan.attempt):
            return False
        self._behind = plan
        self._done()
        return True

    def take_behind(self) -> Plan | None:
        """The plan kept behind, if any, no longer kept: the coordinator takes it up or drops it."""
        plan, self._behind = self._behind, None
        self._done()
        return plan

    def take_held(self) -> Plan | None:
        """The plan held for the current attempt, no longer held; those of earlier ones are dropped."""
        plan = self._held.pop(self._attempt, None)
        for attempt in [a for a in self._held if a < self._attempt]:
            del self._held[attempt]
        self._done()
        return plan

    def abort(self, attempt: int) -> None:
        """``attempt`` was given up by its coordinator: nothing counts for it any more, and the
        plans kept for it are dropped (this node would train for an attempt nobody collects)."""
        self._aborted.add(attempt)
        self._held.pop(attempt, None)
        if self._behind is not None and self._behind.attempt == attempt:
            self._behind = None
        self._done()

    def open_collector(self, attempt: int, col: Collector) -> None:
        """This node collects its children's work for ``attempt`` in ``col``."""
        self._collectors[attempt] = col


class TaskGroup:
    """Where a job's roles start background work; the driver opens it for the job's life."""

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self.nursery is None:
            raise RuntimeError("the job is not running")
        self.nursery.start_soon(fn, *args)


class JobBook:
    """Everything one job's roles share on one node."""

    def __init__(self, info: JobInfo, me: str, job_dir: Path) -> None:
        self.info = info
        self.spec = info.spec
        self.job_id = info.job_id
        self.me = me
        self.dir = job_dir
        self.ledger = Ledger(job_dir / "ledger.msgpack", info.job_id,
                             ChainRules.for_job(info.job_id, info.spec, info.initial_members,
                                                info.submitted_by))
        self.current = RoundState(round=1)
        self.status = StatusRecord()
        self.changed = Notifier()
        self.tasks = TaskGroup()
        self.apply_lock = trio.Lock()
        self.ready = trio.Event()
        self.init_hash = ""
        self.model_size = 0  # parameters of the model this job trains, known once prepared
        self.sized = trio.Event()  # set with model_size: it bounds the model blobs peers may send
        self.presence: dict[str, float] = {}  # peer -> trio time of its last presence
        # Time-budgeted rounds: each member's training throughput for this job (samples per
        # second, as it publishes it; this node's own as it measures it), and this node's device.
        self.rates: dict[str, float] = {}
        self.device = ""
        # Coordinator turns passed while preparing. A node still loading its data and
        # measuring its device when a peer is ready says it plans no attempt of the round
        # (``passed_round``): its turn would hold every member until it is ready. Peers that heard
        # it skip its turns (``passing``: peer -> the round it passes).
        self.loaded = False  # the ledger is read from disk: the current round is known
        self.passed_round = 0
        self.passing: dict[str, int] = {}
        self.left: dict[str, str] = {}  # peer -> why the job failed there, as its presence says
        self.ready_peers: set[str] = set()  # peers whose last presence says they have the job ready
        self.fit: dict[str, Any] = {}  # how the job fits this node's device (gpuflex.ml.fit)
        # Secure aggregation: the group reports of attempts that were aborted (the next
        # coordinator's result records why they failed).
        self.secagg_history: dict[int, list[dict[str, Any]]] = {}

    # -- the ledger and the round ----------------------------------------------------------------

    @property
    def committed(self) -> int:
        """Rounds committed here: the ledger's height."""
        return len(self.ledger)

    def advance(self) -> None:
        """Start the next round's state once the ledger has grown past the current one, or
        went back (a heavier but shorter chain won fork choice): the round after the head."""
        if self.current.round != self.committed + 1:
            self.current = RoundState(round=self.committed + 1)
        self.changed.notify()

    def round_over(self, rs: RoundState) -> bool:
        """Whether round ``rs`` needs no more work here: it committed, or the ledger moved to
        another branch whose next round is another (``advance`` replaced the round state)."""
        return self.committed >= rs.round or self.current is not rs

    def round_open(self, plan: Plan) -> bool:
        """Whether work for ``plan`` still counts: its round is uncommitted, it is in force."""
        return self.committed < plan.round and self.current.in_force(plan)

    @property
    def head_model(self) -> str:
        return self.ledger.results[-1].model_hash if self.ledger.results else self.init_hash

    def recent_durations(self) -> list[WireValue]:
        return [r.metrics.get("duration_s") for r in self.ledger.results]

    def eligible(self) -> list[str]:
        """Who may coordinate: the last committed plan's members (the job's initial ones before
        any), within the allowlist (``ChainRules.eligible``)."""
        return self.ledger.rules.eligible(self.ledger.results)

    def expected_coordinator(self, attempt: int) -> str | None:
        """The one peer whose plan counts for the current round's ``attempt``."""
        return self.ledger.rules.expected_coordinator(self.ledger.results, attempt)

    def coordinator_order(self) -> list[str]:
        return self.ledger.rules.coordinator_order(self.ledger.results)  # attempt a's is the a-th

    @property
    def finished(self) -> bool:
        """Every round committed: the ledger is final, nothing replaces it."""
        return self.committed >= self.spec.rounds or self.status.state == JobState.DONE

    # -- membership -----------------------------------------------------------------------------

    def saw_presence(self, peer: str, rate: float | None = None, *, preparing: bool = False,
                     passes: int | None = None, failed: str = "") -> None:
        """Record ``peer``'s presence: its throughput, whether it has the job ready, the round
        whose coordinator turns it passes (``passes``), and why the job failed there, as it says."""
        now = trio.current_time()
        self.presence.pop(peer, None)
        self.presence[peer] = now  # kept in order of last presence, oldest first
        while len(self.presence) > MAX_PRESENCE:
            # What a peer said lives as long as its presence entry: bounded alike.
            gone = next(iter(self.presence))
            del self.presence[gone]
            if gone != self.me:
                self.rates.pop(gone, None)
            self.passing.pop(gone, None)
            self.left.pop(gone, None)
            self.ready_peers.discard(gone)
        if peer != self.me:
            if rate is not None:
                self.rates[peer] = rate
            if passes is not None:
                self.passing[peer] = passes
            else:
                self.passing.pop(peer, None)
            if failed:
                self.left[peer] = failed
            else:
                self.left.pop(peer, None)
            if preparing or failed:
                self.ready_peers.discard(peer)
            else:
                self.ready_peers.add(peer)
        self.changed.notify()

    def known_members(self) -> set[str]:
        """Whom this job's presence goes to: every peer that said it takes part, the job's
        initial members and possible coordinators, and its submitter (a newcomer's way in).
        Bounded as presence is (``MAX_PRESENCE``)."""
        return set(self.presence) | set(self.info.initial_members) | set(self.eligible()) | {self.info.submitted_by}

    def pass_turns(self) -> bool:
        """While this node is still preparing the job: pass its coordinator turns in the
        current round if an eligible peer with fresh presence has it ready. True when it does
        so now (the caller announces it)."""
        if not self.loaded or self.ready.is_set() or not self.participates() or self.passed_round == self.current.round:
            return False
        now = trio.current_time()
        if not any(p in self.ready_peers and now - self.presence.get(p, -math.inf) <= PRESENCE_FRESH_S
                   for p in self.eligible() if p != self.me):
            return False
        self.passed_round = self.current.round
        return True

    def passed_now(self) -> int:
        """The round whose coordinator turns this node passes while preparing, if it is the
        current one; else 0."""
        return self.passed_round if self.passed_round == self.current.round else 0

    def passing_now(self) -> set[str]:
        """Who said it plans no attempt of the current round (this node included)."""
        r = self.current.round
        out = {p for p, gives_up in self.passing.items() if gives_up == r}
        if self.passed_now():
            out.add(self.me)
        return out

    def may_send_work(self, peer: str) -> bool:
        """Whether ``peer`` could be sending this node an update or partial of this job: a
        member so far, one that said it takes part, or one in the plan in force."""
        plan = self.current.plan
        return (peer in self.presence or peer in self.info.initial_members or peer in self.eligible()
                or (plan is not None and peer in plan.parent))

    def payload_limit(self) -> int:
        """The largest update or partial payload this job's model allows, in bytes."""
        return PAYLOAD_BYTES_PER_PARAM * self.model_size + PAYLOAD_SLACK

    def live_members(self, heard: list[str]) -> list[str]:
        """Who a plan made now would include: this node, fresh presence from ``heard`` peers,
        and the job's known members among them; within the allowlist, if the job has one.
        ``heard``: peers up that this node heard itself (``JobPort.heard_peers``), never a key
        that is up by hearsay alone: presence signed by such a key can be forwarded by anyone."""
        now = trio.current_time()
        up = set(heard)
        fresh = {p for p, t in self.presence.items() if now - t <= PRESENCE_FRESH_S and p in up}
        # Members of the job so far are known to hold it; being up is enough for them.
        known = (set(self.info.initial_members) | set(self.eligible())) & up
        members = ({self.me} | fresh | known) - set(self.left)  # not those that said the job failed there
        if self.spec.allowlist:
            members &= set(self.spec.allowlist)
        return sorted(members)

    def participates(self) -> bool:
        return not self.spec.allowlist or self.me in self.spec.allowlist
