"""One job's rounds on one node: plan, train, reduce, commit (DESIGN.md, "Protocol of one round").

Every node runs the same driver. For round r it computes the coordinator ranking; the first
live candidate signs and gossips a plan, and each backup waits one plan timeout per rank
before taking over. Members train from the plan's base model and stream signed updates up
the group tree; leaders fold them as they arrive and pass a signed partial upward; the root
applies the server optimizer and gossips a RoundResult chained to the previous one. A round
that cannot commit is retried with a new plan from the same base, and a member re-sends the
update it already computed instead of training again, so accepted work is not lost.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import signal
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import trio

from aggregation.secagg import SecAggError
from aggregation.tree import build_tree, children
from gpuflex.node.collector import Collector, ancestors
from gpuflex.node.ledger import Ledger, LedgerError, result_key, result_row
from gpuflex.node.messages import (
    ABORT,
    PARTIAL,
    PLAN,
    RESULT,
    UPDATE,
    Plan,
    Result,
    make_plan,
    parse_partial,
    parse_plan,
    parse_recovery_request,
    parse_result,
    parse_secagg_reports,
    parse_update,
    walk_contributions,
)
from gpuflex.node.modelblob import model_parts, pack_delta, unpack_delta, unpack_model
from gpuflex.node.pipeline import (
    DeltaEncoder,
    decode_payload,
    describe_rule,
    make_reducer,
    outer_step,
    replay_step,
    scripted_dropout,
    secagg_member,
)
from gpuflex.node.placement import order_for_tree
from gpuflex.node.ranking import coordinator_ranking
from gpuflex.privacy import STOP, WARN, budget_status, epsilon_spent
from gpuflex.secure import SecAggMember, SecAggReducer, answer_recovery, collect_answers
from mesh.blob import BlobError, blob_hash, parts_hash
from mesh.codec import WireError, open_envelope, seal
from mesh.fsutil import StateWriteError
from mesh.health import DOWN
from mesh.messaging import Inbound, Rejected, SendError

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec
    from gpuflex.node.jobs import JobManager

log = logging.getLogger("gpuflex.rounds")
FIRST_ROUND_TRAIN_S = 120.0
MIN_TRAIN_S = 15.0
PLAN_TIMEOUT_S = 6.0
REDUCE_SLACK_S = 5.0
PRESENCE_FRESH_S = 10.0
#: The slowest uplink an upload's timeout allows for (2 Mbit/s), so a member on a slow home line,
#: or two sharing one, is not cut off mid-update.
SLOWEST_UPLINK_BPS = 250_000
#: Committed models (and their steps) a node keeps: the head, and the one before it, which a
#: ledger restored from its backup copy would return to. Older ones are deleted, or a long job
#: would fill the disk with a model per round.
MODELS_KEPT = 2


class JobRunner:
    def __init__(self, manager: JobManager, job_id: str, spec: JobSpec, members: list[str], job_frame: bytes,
                 submitted_by: str) -> None:
        self.m = manager
        self.mesh = manager.mesh
        self.me = self.mesh.peer_id
        self.job_id = job_id
        self.spec = spec
        self.initial_members = sorted(set(members))
        self.job_frame = job_frame
        self.submitted_by = submitted_by
        self.dir: Path = manager.jobs_dir / job_id
        self.ledger = Ledger(self.dir / "ledger.msgpack", job_id)
        self.presence: dict[str, float] = {}
        self.plans: dict[int, Plan] = {}
        self.collectors: dict[tuple[int, int], Collector] = {}
        self.cached_updates: dict[tuple[int, str], tuple[bytes, bytes]] = {}
        self.aborted: set[tuple[int, int]] = set()
        self.changed = trio.Event()
        self.apply_lock = trio.Lock()
        self.workload: Any = None
        self.init_hash = ""
        self.state = "pending"
        self.phase = "idle"
        self.phase_started = time.time()
        self.phase_deadline: float | None = None
        self.role = "idle"
        self.error = ""
        self.waiting = ""  # why this node cannot commit now (too few members reachable)
        self.write_error = ""  # the last failed ledger write, until one succeeds
        self.stalled = ""  # why the last attempt of the current round did not commit
        self._nursery: trio.Nursery | None = None
        self.ready = trio.Event()
        self.syncing = False
        self.encoder = DeltaEncoder(spec)
        self.steps_replayed = 0  # committed models rebuilt from the encoded step, not downloaded
        # Secure aggregation: this node's masking side per (round, attempt, leader), kept to answer
        # its leader's recovery request (two coordinators may plan the same attempt, with other
        # leaders), and the group reports of attempts that were aborted.
        self.secagg_sides: dict[tuple[int, int, str], SecAggMember] = {}
        self.secagg_history: dict[int, list[dict[str, Any]]] = {}

    # -- bookkeeping -----------------------------------------------------------------------

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def _set_phase(self, phase: str, deadline: float | None = None) -> None:
        self.phase, self.phase_started, self.phase_deadline = phase, time.time(), deadline

    def emit(self, type_: str, round_: int | None = None, peer: str | None = None, message: str = "",
             **extra: Any) -> None:
        self.m.events.emit(type_, job=self.job_id, round=round_, peer=peer, message=message, **extra)

    @property
    def head_model(self) -> str:
        return self.ledger.results[-1].model_hash if self.ledger.results else self.init_hash

    def recent_coordinators(self) -> list[str]:
        return [r.coordinator for r in self.ledger.results]

    def eligible(self) -> list[str]:
        if self.ledger.results:
            plan = parse_plan(open_envelope(self.ledger.results[-1].plan_frame, expect_kind=PLAN))
            return list(plan.members)
        return list(self.initial_members)

    def live_members(self) -> list[str]:
        now = time.time()
        alive = set(self.mesh.peers.alive())
        fresh = {p for p, t in self.presence.items() if now - t <= PRESENCE_FRESH_S and p in alive}
        # Members of the job so far are known to hold it; being up is enough for them.
        known = (set(self.initial_members) | set(self.eligible())) & alive
        allow = set(self.spec.allowlist)
        members = {self.me} | fresh | known
        if allow:
            members &= allow
        return sorted(members)

    def private_members(self) -> set[str]:
        """Members that say (in their NodeInfo) they cannot accept connections, and this node
        if it is one: they never lead a group or root a round while others can."""
        out = {rec.peer_id for rec in self.mesh.peers.all()
               if (rec.info or {}).get("reachability") in ("private", "relayed")}
        if self.mesh.nat.reachability() in ("private", "relayed"):
            out.add(self.me)
        return out

    def participates(self) -> bool:
        return not self.spec.allowlist or self.me in self.spec.allowlist

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await self._prepare()
                self.state = "running"
                while len(self.ledger) < self.spec.rounds:
                    budget = budget_status(self.spec, len(self.ledger))
                    if budget == STOP:
                        self.emit("privacy_budget", len(self.ledger), message=(
                            f"job {self.job_id}: stopping, round {len(self.ledger) + 1} would exceed "
                            f"ε={self.spec.dp_epsilon_budget:g}"))
                        break
                    if budget == WARN:
                        self.emit("privacy_budget", len(self.ledger), message=(
                            f"job {self.job_id}: privacy budget ε={self.spec.dp_epsilon_budget:g} exceeded"))
                    await self._drive_round(len(self.ledger) + 1)
                self.state, self.phase, self.role = "done", "done", "idle"
                last = self.ledger.results[-1].metrics if self.ledger.results else {}
                self.emit("job_done", len(self.ledger), message=(
                    f"job {self.job_id} done after {len(self.ledger)} rounds: "
                    f"accuracy {last.get('accuracy', float('nan')):.3f}"))
                self._notify()
            except Exception as exc:
                self.state, self.error = "failed", str(exc)
                log.exception("job %s failed", self.job_id)
                self.emit("job_failed", message=f"job {self.job_id} failed: {exc}")
            nursery.cancel_scope.cancel()

    async def _prepare(self) -> None:
        from gpuflex.ml.workload import open_workload

        problems = self.ledger.load()
        for problem in problems:
            self.emit("state_corrupt", message=f"ledger of job {self.job_id}: {problem}; recovering")
        if self.me in self.initial_members:
            index, parts = self.initial_members.index(self.me), len(self.initial_members)
        else:
            parts = max(1, len(self.initial_members))
            index = int.from_bytes(hashlib.blake2b(self.me.encode(), digest_size=4).digest(), "big") % parts
        hook = self.m.adversary.data_hook() if self.m.adversary else None
        self.workload = await trio.to_thread.run_sync(
            lambda: open_workload(self.spec, index, parts, self.m.home, data_hook=hook))
        init = await trio.to_thread.run_sync(self.workload.initial_params)
        self.init_hash = self.mesh.blobs.put_parts(model_parts(init, {}))
        if problems or (self.ledger.results and not self.mesh.blobs.has(self.head_model)):
            await self.m.sync_from_peers(self)
        self.ready.set()

    # -- the driver ------------------------------------------------------------------------

    def _plan_timeout(self) -> float:
        return self.spec.plan_timeout_s or PLAN_TIMEOUT_S

    def _train_budget(self) -> float:
        if self.spec.train_timeout_s:
            return self.spec.train_timeout_s
        durations = [r.metrics.get("duration_s") for r in self.ledger.results[-5:]]
        durations = [d for d in durations if isinstance(d, (int, float)) and d > 0]
        if not durations:
            return FIRST_ROUND_TRAIN_S
        return max(MIN_TRAIN_S, 4.0 * statistics.median(durations))

    async def _wait_change(self, until: float) -> None:
        with trio.move_on_after(max(0.0, until - time.time())):
            await self.changed.wait()

    async def _drive_round(self, r: int) -> None:
        attempt = max((p.attempt for p in self.plans.values() if p.round == r), default=0)
        while len(self.ledger) < r:
            self._set_phase("plan")
            self.role = "idle"
            ranking = coordinator_ranking(self.job_id, r, self.eligible(), self.recent_coordinators(), attempt,
                                          private=self.private_members())
            plan = await self._obtain_plan(r, attempt, ranking)
            if len(self.ledger) >= r:
                return
            if plan is None:
                attempt += 1
                continue
            reason = await self._await_commit(r, plan)
            if reason is None:
                return
            latest = self.plans.get(r)
            attempt = max(plan.attempt, latest.attempt if latest else 0) + 1
            self.emit("round_retried", r, message=f"round {r} attempt {plan.attempt} did not commit ({reason}); "
                                                   f"retrying as attempt {attempt}")

    def _round_end(self, plan: Plan) -> float:
        return plan.train_deadline + (len(plan.members) + 2) * plan.reduce_slack_s + 10.0

    async def _await_commit(self, r: int, plan: Plan) -> str | None:
        """Wait for round ``r`` to commit; the reason it will not, otherwise."""
        grace_until = time.time() + 2.0
        while len(self.ledger) < r:
            current = self.plans.get(r)
            if current is not None and current.attempt > plan.attempt:
                plan = current
            if (r, plan.attempt) in self.aborted:
                return "aborted by its coordinator"
            if time.time() >= self._round_end(plan):
                return "deadline passed"
            rec = self.mesh.peers.get(plan.coordinator)
            if plan.coordinator != self.me and rec is not None and rec.state == DOWN and time.time() > grace_until:
                return f"coordinator {plan.coordinator[-8:]} is down"
            await self._wait_change(min(self._round_end(plan), time.time() + 1.0))
        return None

    async def _obtain_plan(self, r: int, attempt: int, ranking: list[str]) -> Plan | None:
        start = time.time()
        waited = 0
        for cand in ranking:
            plan = self.plans.get(r)
            if plan is not None and plan.attempt >= attempt:
                return plan
            if cand == self.me:
                if self.participates():
                    return await self._coordinate(r, attempt)
                continue
            rec = self.mesh.peers.get(cand)
            if rec is None or rec.state == DOWN:
                continue
            waited += 1
            until = start + waited * self._plan_timeout()
            while time.time() < until and len(self.ledger) < r:
                plan = self.plans.get(r)
                if plan is not None and plan.attempt >= attempt:
                    return plan
                await self._wait_change(until)
        return self.plans.get(r)

    async def _coordinate(self, r: int, attempt: int) -> Plan | None:
        wait_until = time.time() + 60.0
        members = self.live_members()
        while len(members) < self.spec.min_nodes and time.time() < wait_until and len(self.ledger) < r:
            self._set_phase("plan")
            await trio.sleep(1.0)
            members = self.live_members()
        if len(self.ledger) >= r:  # caught up from peers while waiting
            return None
        if len(members) < self.spec.min_nodes:
            self.emit("round_waiting", r, message=(
                f"round {r}: only {len(members)} of min_nodes={self.spec.min_nodes} members reachable; not planning"))
            return None
        ordered, group_size = order_for_tree(self.me, members, self.private_members(), self.spec.group_size)
        flat = self.spec.aggregation_mode == "flat-robust"  # leaders only forward: the root sees all
        parent = build_tree(ordered, max(2, len(ordered)) if flat else group_size, self.me)
        now = time.time()
        frame = make_plan(
            self.mesh.identity, job=self.job_id, round=r, attempt=attempt, coordinator=self.me,
            base_hash=self.head_model, prev_result=self.ledger.head, members=ordered, parent=parent,
            train_deadline=now + self._train_budget(), reduce_slack_s=self.spec.reduce_timeout_s or REDUCE_SLACK_S,
        )
        await self.mesh.broadcast(frame)
        return self.plans.get(r)

    # -- inbound: plans --------------------------------------------------------------------

    async def _wait_for(self, predicate: Any, timeout: float) -> bool:
        """Let a message that arrived early wait for this node's state to catch up."""
        deadline = time.time() + timeout
        while not predicate():
            if time.time() >= deadline:
                return False
            await self._wait_change(min(deadline, time.time() + 0.5))
        return True

    async def on_plan(self, msg: Inbound) -> None:
        plan = parse_plan(msg.envelope)
        with trio.move_on_after(30):
            await self.ready.wait()
        # The previous round's result may still be being applied here (model download).
        await self._wait_for(lambda: len(self.ledger) >= plan.round - 1, 15.0)
        r = len(self.ledger) + 1
        if plan.round != r or plan.prev_result != self.ledger.head or plan.base_hash != self.head_model:
            raise Rejected(f"plan for round {plan.round} does not extend this node's ledger at round {r - 1}")
        if plan.coordinator not in set(self.eligible()) | {self.me}:
            raise WireError("round", f"plan from {plan.coordinator[-8:]}, who is not a member of this job")
        current = self.plans.get(r)
        if current is not None:
            if plan.attempt < current.attempt:
                raise Rejected("plan for an older attempt")
            if plan.attempt == current.attempt:
                ranking = coordinator_ranking(self.job_id, r, self.eligible(), self.recent_coordinators(),
                                              plan.attempt, private=self.private_members())
                rank = {p: i for i, p in enumerate(ranking)}
                if rank.get(plan.coordinator, math.inf) >= rank.get(current.coordinator, math.inf):
                    raise Rejected("a plan from a better-ranked coordinator is already in force")
        self.plans[r] = plan
        self.emit("plan_received", r, plan.coordinator, message=(
            f"round {r}: plan from {plan.coordinator[-8:]} with {len(plan.members)} members"))
        self._start_round_tasks(plan)
        self._notify()

    def _start_round_tasks(self, plan: Plan) -> None:
        assert self._nursery is not None
        if self.me not in plan.parent:
            self.role = "idle"
            return
        is_root = plan.coordinator == self.me
        has_children = bool(children(plan.parent, self.me))
        self.role = "root" if is_root else ("leader" if has_children else "member")
        if is_root or has_children:
            # A finished round's collector holds a model-sized sum: keep only this round's.
            self.collectors = {k: v for k, v in self.collectors.items() if k[0] >= plan.round}
            col = Collector(plan, self.me, make_reducer(self.spec, is_root, plan=plan, me=self.me))
            self.collectors[(plan.round, plan.attempt)] = col
            self._nursery.start_soon(self._reduce, plan, col)
        self._nursery.start_soon(self._train_and_send, plan)

    # -- member: train and send ------------------------------------------------------------

    async def _model(self, digest: str, providers: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The model blob ``digest``, re-fetched from peers if the local copy fails its hash."""
        await self.mesh.fetch_blob(digest, providers)
        try:
            data = self.mesh.blobs.read(digest, verify=True)
        except BlobError as exc:
            self.emit("state_corrupt", message=f"{exc}; fetching it again from peers")
            await self.mesh.fetch_blob(digest, providers or self.mesh.peers.alive())
            data = self.mesh.blobs.read(digest, verify=True)
        return unpack_model(data)

    async def _committed_model(self, res: Result) -> None:
        """Hold the model a result commits: rebuilt from the previous model and the encoded
        step where the root sent one, else (or if the rebuild does not match) downloaded."""
        blobs = self.mesh.blobs
        if res.step_hash is not None and not blobs.has(res.model_hash) and blobs.has(res.base_hash):
            try:
                await self.mesh.fetch_blob(res.step_hash, [res.coordinator], timeout=60)
                parts = await trio.to_thread.run_sync(self._replay, res)
                if parts_hash(parts) == res.model_hash:
                    blobs.put_parts(parts)
                    self.steps_replayed += 1
                else:
                    log.warning("round %d: the model rebuilt from the step does not match %s; "
                                "downloading it", res.round, res.model_hash[:12])
            except (BlobError, WireError) as exc:
                log.info("round %d: rebuilding from the step failed (%s); downloading the model",
                         res.round, exc)
        await self._model(res.model_hash, [res.coordinator])

    def recent_blobs(self) -> set[str]:
        """The models (and steps) this job still needs on this node."""
        recent = self.ledger.results[-MODELS_KEPT:]
        keep = {x.model_hash for x in recent} | {x.step_hash for x in recent if x.step_hash}
        if len(self.ledger.results) < MODELS_KEPT:
            keep.add(self.init_hash)
        return keep

    def _prune_blobs(self) -> None:
        """Delete the model (and step) that the last commit moved out of ``recent_blobs``."""
        gone = len(self.ledger.results) - MODELS_KEPT  # the round whose model just left the window
        if gone < 0:
            return
        old = self.ledger.results[gone - 1] if gone else None
        stale = {self.init_hash} if old is None else {old.model_hash, old.step_hash or ""}
        for digest in stale - self.m.blobs_in_use() - {""}:
            try:
                self.mesh.blobs.discard(digest)
            except OSError as exc:
                log.warning("could not delete old model blob %s: %s", str(digest)[:12], exc)

    def _replay(self, res: Result) -> list[memoryview]:
        assert res.step_hash is not None
        params, state = unpack_model(self.mesh.blobs.read(res.base_hash, verify=True))
        step = self.mesh.blobs.read(res.step_hash, verify=True)
        return model_parts(*replay_step(self.spec, params, state, step))

    async def _train_and_send(self, plan: Plan) -> None:
        r = plan.round
        try:
            key = (r, plan.base_hash)
            if key not in self.cached_updates:
                self._set_phase("train", plan.train_deadline)
                # A copy of the parameters alone: the blob they are read from (which also holds
                # the server optimizer's state) is freed before training starts.
                params = (await self._model(plan.base_hash, [plan.coordinator]))[0].copy()
                delta, metrics = await trio.to_thread.run_sync(self.workload.train, params)
                delta = self.m.adversary.tamper(delta) if self.m.adversary else delta
                self.emit("trained", r, self.me, message=(
                    f"round {r}: trained on {metrics.get('samples')} samples in {metrics.get('seconds', 0):.2f}s"),
                    samples=metrics.get("samples"), seconds=metrics.get("seconds"))
                samples = int(metrics.get("dataset_size") or self.workload.num_samples)
                # Under secure aggregation this is the clear (DP-noised) delta; it is masked below,
                # per attempt, because the masks depend on the attempt's group and leader.
                payload = self.encoder.encode(delta, samples)
                frame = seal(self.mesh.identity, UPDATE, {
                    "job": self.job_id, "round": r, "peer": self.me, "base_hash": plan.base_hash,
                    "samples": samples,
                    "delta_hash": blob_hash(payload), "delta_size": int(delta.size),
                    "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
                })
                self.cached_updates = {k: v for k, v in self.cached_updates.items() if k[0] >= r}
                self.cached_updates[key] = (frame, payload)
            frame, payload = self.cached_updates[key]
            side = secagg_member(self.spec, self.mesh.identity, plan)
            if side is not None:
                frame, payload = await self._mask_update(plan, side, frame, payload)
            elif plan.attempt:  # sealed afresh: who got it in an earlier attempt would take it for a replay
                frame = seal(self.mesh.identity, UPDATE, open_envelope(frame, expect_kind=UPDATE).body)
            self._set_phase("reduce", plan.train_deadline)
            col = self.collectors.get((r, plan.attempt))
            if col is not None and col.plan.env.digest == plan.env.digest:  # not a replaced plan's
                up = parse_update(open_envelope(frame, expect_kind=UPDATE))
                col.add_update(up, decode_payload(self.spec, payload, up.delta_size))
                return
            await self._send_up(plan, frame, payload, "update", masked=side is not None)
        except (SendError, WireError, OSError) as exc:
            self.emit("update_failed", r, message=f"round {r}: could not deliver this node's update: {exc}")
        except Exception as exc:
            log.exception("training for round %d failed", r)
            self.emit("update_failed", r, message=f"round {r}: local training failed: {exc}")

    async def _mask_update(self, plan: Plan, side: SecAggMember, frame: bytes,
                           payload: bytes) -> tuple[bytes, bytes]:
        """The cached clear update, masked for this attempt's group and signed again.

        The DP noise was drawn once, at training time: a retry masks the same noisy delta, so
        no one can average fresh noise away across attempts. Masking expands g - 1 PRG streams
        of the model's size, so it runs off the event loop.
        """
        up = parse_update(open_envelope(frame, expect_kind=UPDATE))
        masked = await trio.to_thread.run_sync(side.encode, unpack_delta(payload, up.delta_size), up.samples)
        self.secagg_sides = {k: v for k, v in self.secagg_sides.items() if k[0] >= plan.round}
        self.secagg_sides[(plan.round, plan.attempt, side.ctx.leader)] = side
        if scripted_dropout(side.ctx, self.me, self.mesh.config.listen):
            self.emit("secagg_test_drop", plan.round, self.me, message=(
                f"round {plan.round}: test mesh: exiting right after masking, before the update is sent"))
            os.kill(os.getpid(), signal.SIGKILL)
        return seal(self.mesh.identity, UPDATE, {**up.env.body, "delta_hash": blob_hash(masked)}), masked

    async def on_secagg_recover(self, msg: Inbound) -> bytes:
        """Answer this node's leader with the seed shares that unmask a group sum after a dropout."""
        if msg.gossip:  # only the leader's direct request counts; a relay is not to blame
            raise Rejected("a recovery request must come straight from its leader, not by gossip")
        req = parse_recovery_request(msg.envelope)
        current = len(self.ledger) + 1
        if req.round < current:
            raise Rejected(f"round {req.round} is already committed here")
        if req.round > current:
            raise WireError("round", f"recovery request for round {req.round}, this node is at round {current}")
        side = self.secagg_sides.get((req.round, req.attempt, req.leader))
        if side is None:  # a restart lost the keys, or this node never masked for that leader
            raise Rejected(f"this node sent {req.leader[-8:]} no masked update in round {req.round} "
                           f"attempt {req.attempt}")
        reply = answer_recovery(self.mesh.identity, side, req)
        self.emit("secagg_answered", req.round, req.leader, message=(
            f"round {req.round}: gave {len(req.shares)} seed shares to {req.leader[-8:]} to recover "
            f"{len(req.dropped)} dropped member(s)"))
        return reply

    def _round_open(self, plan: Plan) -> bool:
        current = self.plans.get(plan.round)
        return (len(self.ledger) < plan.round and (plan.round, plan.attempt) not in self.aborted
                and (current is None or current.attempt == plan.attempt))

    async def _send_up(self, plan: Plan, frame: bytes, payload: bytes, what: str, masked: bool = False) -> None:
        """Deliver to the parent, or the next live ancestor; then keep watching the receiver,
        and deliver again one level up if it dies before the round commits, so work a leader
        accepted is not lost with it. A masked update goes to its own leader only: no other
        node could unmask it."""
        chain = ancestors(plan.parent, self.me)[: 1 if masked else None]
        errors: list[str] = []
        index = 0
        while index < len(chain) and self._round_open(plan):
            target = chain[index]
            try:
                # A home uplink moves a model-sized payload in seconds to minutes, not in a fixed 10 s.
                timeout = max(10.0, plan.reduce_slack_s * 2, len(payload) / SLOWEST_UPLINK_BPS)
                await self.mesh.request(target, frame, payload, timeout=timeout)
            except SendError as exc:
                errors.append(str(exc))
                log.warning("round %d: %s to %s failed (%s); trying the next ancestor", plan.round, what,
                            target[-8:], exc)
                index += 1
                continue
            self.emit(f"{what}_sent", plan.round, target, message=f"round {plan.round}: {what} sent to {target[-8:]}")
            while self._round_open(plan) and time.time() < self._round_end(plan):
                rec = self.mesh.peers.get(target)
                if rec is not None and rec.state == DOWN:
                    self.emit("resend", plan.round, target, message=(
                        f"round {plan.round}: {target[-8:]} died holding this node's {what}; sending it higher"))
                    break
                await self._wait_change(time.time() + 1.0)
            else:
                return
            index += 1
        if errors and self._round_open(plan):
            raise SendError("; ".join(errors))

    # -- leader / root: reduce --------------------------------------------------------------

    async def _collector_for(self, job: str, round_: int, sender: str) -> Collector:
        def ready() -> bool:
            plan = self.plans.get(round_)
            return len(self.ledger) >= round_ - 1 and plan is not None and (round_, plan.attempt) in self.collectors

        if job == self.job_id and round_ >= len(self.ledger) + 1:
            await self._wait_for(ready, 5.0)  # the plan may reach this leader after the update
        if job != self.job_id or round_ != len(self.ledger) + 1:
            raise WireError("round", f"message for round {round_}, this node is at round {len(self.ledger) + 1}")
        plan = self.plans.get(round_)
        col = self.collectors.get((round_, plan.attempt)) if plan else None
        if col is None or not col.accepts(sender):
            raise Rejected(f"not collecting from {sender[-8:]} for round {round_}")
        return col

    async def on_update(self, msg: Inbound) -> None:
        up = parse_update(msg.envelope)
        col = await self._collector_for(up.job, up.round, up.peer)
        if up.base_hash != col.plan.base_hash:
            raise WireError("round", "update was trained from another base model")
        if msg.payload is None or blob_hash(msg.payload) != up.delta_hash:
            raise WireError("hash", f"delta from {up.peer[-8:]} does not match its signed hash")
        col.add_update(up, decode_payload(self.spec, msg.payload, up.delta_size))
        self.emit("update_received", up.round, up.peer, message=f"round {up.round}: update from {up.peer[-8:]}")

    async def on_partial(self, msg: Inbound) -> None:
        part = parse_partial(msg.envelope)
        col = await self._collector_for(part.job, part.round, part.leader)
        if msg.payload is None or blob_hash(msg.payload) != part.delta_hash:
            raise WireError("hash", f"partial from {part.leader[-8:]} does not match its signed hash")
        ups = walk_contributions(part.updates, part.partials, part.job, part.round)
        covers = {u.peer for u in ups}
        if not covers <= col.allowed or covers & col.covered or sum(u.samples for u in ups) != part.samples:
            raise WireError("round", f"partial from {part.leader[-8:]} covers the wrong contributions")
        if any(u.base_hash != col.plan.base_hash for u in ups):
            raise WireError("round", "partial mixes updates from another base model")
        col.add_partial(part, unpack_delta(msg.payload, len(msg.payload) // 4), covers)
        self.emit("partial_verified", part.round, part.leader, message=(
            f"round {part.round}: partial from {part.leader[-8:]} verified ({len(ups)} updates)"))

    async def _collect(self, col: Collector) -> None:
        """Wait for the children, expecting the children of any child that goes down instead."""
        while not col.done.is_set() and time.time() < col.deadline:
            for child in sorted(col.expected - col.reported - {self.me}):
                rec = self.mesh.peers.get(child)
                if rec is not None and rec.state == DOWN:
                    col.child_down(child)
                    self.emit("leader_down", col.plan.round, child, message=(
                        f"round {col.plan.round}: {child[-8:]} is down; expecting its group directly"))
            with trio.move_on_after(max(0.0, min(1.0, col.deadline - time.time()))):
                await col.done.wait()
        col.closed = True

    async def _reduce(self, plan: Plan, col: Collector) -> None:
        try:
            await self._collect(col)
            if (plan.round, plan.attempt) in self.aborted or len(self.ledger) >= plan.round:
                return
            if col.acc.count == 0:
                self.emit("reduce_empty", plan.round, message=f"round {plan.round}: nothing reached this leader")
                return
            updates, samples = col.updates, col.samples
            reports = [r for p in col.partials for r in p.secagg]
            avg: np.ndarray | None
            if isinstance(col.acc, SecAggReducer):
                avg, report = await self._secagg_unmask(plan, col.acc)
                reports.insert(0, report)
                if avg is None:  # the masked sum is lost: keep only what came in clear
                    updates = [u for u in col.updates if u.peer not in col.acc.ctx.group]
                    samples = sum(u.samples for u in updates) + sum(p.samples for p in col.partials)
                    avg = col.acc.plain_result()
            else:
                avg = col.acc.result()
            upd_frames = [u.env.raw for u in updates]
            part_frames = [p.env.raw for p in col.partials]
            if plan.coordinator == self.me:
                await self._commit(plan, col, avg, upd_frames, part_frames, reports)
                return
            if avg is None:
                self.emit("partial_failed", plan.round, message=(
                    f"round {plan.round}: nothing left to send after secure aggregation failed"))
                return
            payload = pack_delta(avg)
            body = {
                "job": self.job_id, "round": plan.round, "attempt": plan.attempt, "leader": self.me,
                "samples": samples, "delta_hash": blob_hash(payload), "updates": upd_frames,
                "partials": part_frames,
            }
            if self.spec.secure_aggregation:
                body["secagg"] = reports
            frame = seal(self.mesh.identity, PARTIAL, body)
            await self._send_up(plan, frame, payload, "partial")
        except (SendError, WireError, OSError) as exc:
            self.emit("partial_failed", plan.round, message=f"round {plan.round}: partial not delivered: {exc}")
        except Exception as exc:
            log.exception("reduce for round %d failed", plan.round)
            self.emit("partial_failed", plan.round, message=f"round {plan.round}: reduce failed: {exc}")

    async def _secagg_unmask(self, plan: Plan, red: SecAggReducer) -> tuple[np.ndarray | None, dict[str, Any]]:
        """The group mean, after asking the survivors for the shares that rebuild the masks
        dropped members left dangling; None (and a failed report) rather than a wrong sum."""
        survivors, dropped = red.survivors(), red.missing()
        report: dict[str, Any] = {"leader": self.me, "attempt": plan.attempt, "survivors": survivors,
                                  "dropped": dropped, "recovered": True, "reason": ""}
        try:
            if dropped:
                red.check_recoverable()
                await self._ask_survivors(plan, red)
            avg = red.result()
        except SecAggError as exc:
            report.update(recovered=False, reason=str(exc))
            self.emit("secagg_recovery_failed", plan.round, message=(
                f"round {plan.round}: secure aggregation could not recover the group sum ({exc}); "
                f"the {len(survivors)} masked update(s) of this group are left out"))
            return None, report
        if dropped:
            self.emit("secagg_recovered", plan.round, message=(
                f"round {plan.round}: unmasked the sum of {len(survivors)} survivors after "
                f"{len(dropped)} member(s) dropped"))
        return avg, report

    async def _ask_survivors(self, plan: Plan, red: SecAggReducer) -> None:
        """One bounded round trip to all survivors at once; a survivor that does not answer in
        time only counts against the threshold, one whose answer is bad is also penalised."""
        timeout = max(2.0, plan.reduce_slack_s)

        async def request(holder: str, frame: bytes) -> object:
            return await self.mesh.request(holder, frame, timeout=timeout)

        problems = await collect_answers(self.mesh.identity, red, request, timeout + 1.0)
        for holder, exc in sorted(problems.items()):
            if isinstance(exc, WireError):
                self.m.penalise(holder)
                self.emit("rejected", plan.round, holder, message=(
                    f"round {plan.round}: recovery answer from {holder[-8:]} rejected: {exc}"))
            else:
                log.warning("round %d: no recovery answer from %s: %s", plan.round, holder[-8:], exc)

    async def _commit(self, plan: Plan, col: Collector, avg: np.ndarray | None, upd_frames: list[bytes],
                      part_frames: list[bytes], secagg_reports: list[dict[str, Any]] | None = None) -> None:
        self._set_phase("commit")
        contributions = walk_contributions(upd_frames, part_frames, self.job_id, plan.round)
        failed = [r for r in secagg_reports or [] if not r["recovered"]]
        if len(contributions) < self.spec.min_nodes or avg is None:
            self.aborted.add((plan.round, plan.attempt))
            why = "".join(f"; secure aggregation failed in the group of {r['leader'][-8:]}: {r['reason']}"
                          for r in failed)
            present = {u.peer for u in contributions}
            why += "".join(f"; missing {p[-8:]}: {self.mesh.nat.why_unreachable(p) or 'no update arrived'}"
                           for p in sorted(set(plan.members) - present)[:8])
            body: dict[str, Any] = {
                "job": self.job_id, "round": plan.round, "attempt": plan.attempt,
                "reason": f"{len(contributions)} contributions < min_nodes={self.spec.min_nodes}{why}"}
            if secagg_reports:
                body["secagg"] = secagg_reports
            await self.mesh.broadcast(seal(self.mesh.identity, ABORT, body))
            return
        params, state = await self._model(plan.base_hash, [])
        new_params, new_state, step = await trio.to_thread.run_sync(outer_step, self.spec, params, state, avg)
        model_hash = self.mesh.blobs.put_parts(model_parts(new_params, new_state))
        step_hash = self.mesh.blobs.put(step) if step is not None else None
        evaluation = await trio.to_thread.run_sync(self.workload.evaluate, new_params)
        total = sum(u.samples for u in contributions)
        train_loss = sum(u.metrics.get("train_loss", 0.0) * u.samples for u in contributions) / max(1, total)
        metrics = {**{k: float(v) for k, v in evaluation.items()}, "train_loss": float(train_loss),
                   "contributors": len(contributions), "samples": total,
                   "duration_s": round(time.time() - plan.issued, 3)}
        if self.spec.uses_dp:
            metrics["epsilon"] = round(epsilon_spent(self.spec, plan.round), 4)
        present = {u.peer for u in contributions}
        frame = seal(self.mesh.identity, RESULT, {
            "job": self.job_id, "round": plan.round, "attempt": plan.attempt, "coordinator": self.me,
            "prev_result": self.ledger.head, "base_hash": plan.base_hash, "model_hash": model_hash,
            "plan": plan.env.raw, "updates": upd_frames, "partials": part_frames,
            "contributors": [{"peer": u.peer, "samples": u.samples, "delta_hash": u.delta_hash}
                             for u in contributions],
            "absent": sorted(set(plan.members) - present), "metrics": metrics, "strategy": self.spec.strategy,
            "rule": describe_rule(self.spec), "spec_hash": blob_hash(self.spec.canonical_bytes()),
            **({"step_hash": step_hash} if step_hash is not None else {}),
            **({"secagg": self.secagg_history.get(plan.round, []) + (secagg_reports or [])}
               if self.spec.secure_aggregation else {}),
        })
        await self.mesh.broadcast(frame)

    # -- inbound: results and aborts ---------------------------------------------------------

    async def on_abort(self, msg: Inbound) -> None:
        body = msg.envelope.body
        if not isinstance(body, dict) or body.get("job") != self.job_id:
            raise WireError("garbled", "abort for another job")
        plan = self.plans.get(body.get("round"))  # type: ignore[arg-type]
        if plan is None or plan.coordinator != msg.envelope.sender or plan.attempt != body.get("attempt"):
            raise Rejected("abort does not match the plan in force")
        self.aborted.add((plan.round, plan.attempt))
        if self.spec.secure_aggregation:  # the next coordinator records why this attempt failed
            reports = parse_secagg_reports(body.get("secagg", []), "abort")
            self.secagg_history = {r: v for r, v in self.secagg_history.items() if r >= plan.round}
            self.secagg_history.setdefault(plan.round, []).extend(reports)
        self.stalled = f"round {plan.round} attempt {plan.attempt} aborted: {str(body.get('reason', ''))[:600]}"
        self.emit("round_aborted", plan.round, msg.envelope.sender, message=(
            f"round {plan.round}: coordinator aborted attempt {plan.attempt}: {body.get('reason', '')}"))
        self._notify()

    async def on_result(self, msg: Inbound) -> None:
        res = parse_result(msg.envelope)
        if res.job != self.job_id:
            raise WireError("garbled", "result for another job")
        if res.round <= len(self.ledger):
            ours = self.ledger.results[res.round - 1]
            if ours.digest != res.digest and result_key(res) < result_key(ours):
                assert self._nursery is not None
                self._nursery.start_soon(self.m.sync_from_peers, self, [res.coordinator, msg.via])
                raise Rejected(f"competing result for round {res.round}; fetching its chain")
            raise Rejected(f"round {res.round} is already committed here")
        assert self._nursery is not None
        self._nursery.start_soon(self._apply_result, msg.envelope.raw, res)

    async def _apply_result(self, frame: bytes, res: Result) -> None:
        async with self.apply_lock:
            if res.round != len(self.ledger) + 1 or res.prev_result != self.ledger.head:
                if res.round >= len(self.ledger) + 1 and self._nursery is not None:
                    # Behind, or on another branch: fetch the chain (outside this lock).
                    self._nursery.start_soon(self.m.sync_from_peers, self, [res.coordinator])
                return
            try:
                from gpuflex.node.ledger import verify_chain

                verify_chain([*self.ledger.frames, frame], self.job_id)
                if res.metrics.get("contributors", 0) < self.spec.min_nodes:
                    raise LedgerError(f"round {res.round}: fewer contributions than min_nodes")
                await self._committed_model(res)
                self.ledger.append(frame, res)
                self.m.write_recovered(self)
                self._prune_blobs()
                assert self._nursery is not None
                # Any peer (a late joiner, a node resyncing) can now find the model by hash.
                self._nursery.start_soon(self.mesh.announce_blob, res.model_hash)
            except (LedgerError, WireError) as exc:
                self.emit("rejected", res.round, res.coordinator, message=f"round {res.round}: result rejected: {exc}")
                self.m.penalise(res.coordinator)
                return
            except StateWriteError as exc:
                self.m.write_failed(self, res.round, exc)
                return
            except Exception as exc:
                self.emit("commit_failed", res.round, message=f"round {res.round}: could not record the result: {exc}")
                return
            for c in res.contributors:
                self.m.credit(c.get("peer"))
            met = res.metrics
            self.emit("round_committed", res.round, res.coordinator, message=(
                f"round {res.round} committed by {res.coordinator[-8:]}: loss {met.get('loss', float('nan')):.3f}, "
                f"accuracy {met.get('accuracy', float('nan')):.3f}, {met.get('contributors')} contributors"),
                metrics=met)
            self._notify()

    # -- reporting ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        r = len(self.ledger) + 1
        plan = self.plans.get(r)
        coordinator = plan.coordinator if plan else (
            self.ledger.results[-1].coordinator if self.ledger.results else None)
        if self.phase in ("train", "reduce") and self.phase_deadline:
            span = max(1e-6, self.phase_deadline - self.phase_started)
            progress = min(1.0, (time.time() - self.phase_started) / span)
        else:
            progress = 1.0 if self.state == "done" else 0.0
        col = self.collectors.get((r, plan.attempt)) if plan else None
        if col is not None and self.phase == "reduce":
            progress = col.progress
        return {
            "job_id": self.job_id, "name": self.spec.name, "state": self.state, "round": len(self.ledger),
            "rounds": self.spec.rounds, "phase": self.phase, "phase_progress": round(progress, 3),
            "coordinator": coordinator, "is_coordinator": coordinator == self.me, "role": self.role,
            "members": list(plan.members) if plan else self.eligible(), "error": self.error,
            "waiting": self.waiting if self.state == "running" else "", "write_error": self.write_error,
            "stalled": self.stalled if self.state == "running" and self.stalled.startswith(f"round {r} ") else "",
            "attempt": plan.attempt if plan else 0, "tree": dict(plan.parent) if plan else {},
            "model_hash": self.head_model, "steps_replayed": self.steps_replayed,
            "epsilon": epsilon_spent(self.spec, len(self.ledger)) if self.spec.uses_dp else None,
            "epsilon_budget": self.spec.dp_epsilon_budget or None,
            "metrics": [{"round": x.round, "coordinator": x.coordinator, **{k: x.metrics.get(k) for k in
                         ("loss", "accuracy", "train_loss", "contributors", "duration_s")}}
                        for x in self.ledger.results],
        }

    def ledger_rows(self) -> list[dict[str, Any]]:
        return [result_row(x) for x in self.ledger.results]
