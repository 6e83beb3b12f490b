"""The member's side of a round: train from the plan's base model, sign the update, send it up.

The trained update is kept per (round, base model): a retried attempt of the same round
re-sends it (sealed afresh, or masked afresh for the new group) instead of training again, so
accepted work is not lost and, under DP, no fresh noise can be averaged across attempts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import numpy as np
import trio

from aggregation.scaffold import CONTROL_KEY
from gpuflex.node.ahead import HeadStart, merged_metrics
from gpuflex.node.core.kinds import EventKind, Phase
from gpuflex.node.core.messages import (
    Plan,
    TrainedUpdate,
    capped,
    parse_recovery_request,
    seal_update,
)
from gpuflex.node.core.modelblob import unpack_delta
from gpuflex.node.core.pipeline import DeltaEncoder, secagg_member
from gpuflex.node.core.placement import nonce_commitment, secagg_nonce
from gpuflex.node.core.secure import SecAggMember, answer_recovery
from gpuflex.node.core.workplan import RATE_WEIGHT, blend, fits_plan, local_work
from gpuflex.node.faults import Faults
from gpuflex.node.ownmodel import OWN_MODEL_FILE, OwnModel
from gpuflex.node.port import JobPort, ModelLoader, Trainer
from gpuflex.node.state import JobBook, RoundDeadlines
from gpuflex.node.uplink import Work, send_up
from mesh.blob import blob_hash
from mesh.codec import WireError, WireReason
from mesh.messaging import Inbound, Rejected, SendError

log = logging.getLogger("gpuflex.member")
#: Folds this node's own update into the collector it runs for ``plan``, if it leads a group
#: of it (the driver's ``_fold_own``); False when the update must be sent up instead.
FoldOwn = Callable[[Plan, TrainedUpdate], bool]

#: Under a compute budget, training stops at least this long before the training deadline,
#: so the update still reaches its leader in time.
SEND_MARGIN_S = 1.0
#: How late the plan reached this member, and how long its update takes from the end of its
#: training to its leader, are taken off its budget, so that its update arrives with the
#: others'; but it always trains at least this share of the budget (a one-off stall, or a
#: clock that disagrees with the coordinator's, must not leave a member no time to train).
MIN_TRAIN_SHARE = 0.25
#: A member's training never gets less than this: a zero limit would mean "no time limit".
MIN_TRAIN_S = 0.001


class Member:
    def __init__(self, port: JobPort, book: JobBook, encoder: DeltaEncoder, faults: Faults,
                 load_model: ModelLoader, trainer: Callable[[], Trainer],
                 fold_own: FoldOwn = lambda plan, trained: False) -> None:
        self.port, self.book, self.encoder, self.faults = port, book, encoder, faults
        self._load_model = load_model
        self._trainer = trainer
        self._fold_own = fold_own
        self._trained_at: float | None = None  # when this round's training ended, until sent
        self.send_lag_s = 0.0  # how long this node's update takes from its training's end to its leader
        # This node's trained update per (round, base model): a retried attempt re-sends it.
        self.cached: dict[tuple[int, str], TrainedUpdate] = {}
        # Set when the training for a (round, base model) ends: a retried attempt that arrives
        # mid-training waits for that update instead of training a second one.
        self.training: dict[tuple[int, str], trio.Event] = {}
        # Secure aggregation: this node's masking side per (round, attempt, leader), kept to
        # answer its leader's recovery request (two coordinators may plan the same attempt,
        # with other leaders).
        self.secagg_sides: dict[tuple[int, int, str], SecAggMember] = {}
        # overlap > 0: the next round's first steps are trained while this round's update travels.
        self.head_start = HeadStart(book.spec.overlap) if book.spec.overlap > 0 else None
        self._pending_ahead: tuple[int, Trainer, np.ndarray, int] | None = None  # the root's, until it commits
        # fragments > 1: a round syncs one fragment; this member's own model carries the rest.
        self.own = OwnModel(book.dir / OWN_MODEL_FILE, book.spec.fragments) if book.spec.fragments > 1 else None

    async def train_and_send(self, plan: Plan, deadlines: RoundDeadlines) -> None:
        """Train (or reuse this round's update), then deliver it up the tree. Failures are
        reported as events: a member's failure never stops the job."""
        r = plan.round
        try:
            side = secagg_member(self.book.spec, self.port.identity, plan)
            if side is not None and len(side.ctx.group) < self.book.spec.secagg_min_group:
                self._refuse_group(plan, len(side.ctx.group))
                return
            trained = await self._update_for(plan, deadlines)
            if side is not None:
                trained = await self._mask(plan, side, trained)
            elif trained.update.plan != plan.digest:
                # Signed for this plan alone: it counts in no other attempt's result.
                body = {**trained.update.env.body, "plan": plan.digest}
                trained = seal_update(self.port.identity, trained.payload, **body)
            self.book.status.set_phase(Phase.REDUCE, deadlines.train)
            if self._fold_own(plan, trained):  # this node leads its own group: folded here
                self._sent()
                return
            await send_up(self.port, self.book, plan, deadlines, trained.frame, trained.payload, Work.UPDATE,
                          masked=side is not None, delivered=self._sent)
        except (SendError, WireError, OSError) as exc:
            self.port.emit(EventKind.UPDATE_FAILED, r,
                           message=f"round {r}: could not deliver this node's update: {exc}")
        except Exception as exc:  # user code (a model, a train_fn plug-in) may raise anything;
            # one member's failed round must not end the job, which the others carry on
            log.exception("training for round %d failed", r)
            self.port.emit(EventKind.UPDATE_FAILED, r, message=f"round {r}: local training failed: {exc}")

    async def _update_for(self, plan: Plan, deadlines: RoundDeadlines) -> TrainedUpdate:
        """This node's signed clear update for the plan's round and base model, trained once."""
        r = plan.round
        key = (r, plan.base_hash)
        if (running := self.training.get(key)) is not None:
            await running.wait()  # an earlier attempt's training of the same update
        cached = self.cached.get(key)
        if cached is not None and not fits_plan(plan, self.book.me, cached.update.steps):
            del self.cached[key]  # trained for an attempt that allowed more steps
        if key not in self.cached:
            self.training = {k: v for k, v in self.training.items() if k[0] >= r}
            self.training[key] = done = trio.Event()
            try:
                await self._train(plan, deadlines)
            finally:
                done.set()
        return self.cached[key]

    async def _train(self, plan: Plan, deadlines: RoundDeadlines) -> None:
        """Train from the plan's base model and cache the signed update."""
        book, r = self.book, plan.round
        key = (r, plan.base_hash)
        book.status.set_phase(Phase.TRAIN, deadlines.train)
        if self.head_start is not None:
            self.head_start.plan_arrived(self.port.clock.now())
        # A copy of the parameters alone: the blob they are read from (which also holds
        # the server optimizer's state) is freed before training starts.
        params, state = await self._load_model(plan.base_hash, [plan.coordinator])
        params = params.copy()
        # SCAFFOLD's control variate travels in the server state; nothing else of it is needed.
        control = {k: v.copy() for k, v in state.items() if k == CONTROL_KEY}
        del state
        trainer = self._trainer()
        steps, budget = local_work(plan, book.me)
        if budget:
            # The budget runs from when the coordinator issued the plan (its training deadline
            # less the job's training time, on this node's clock), less the time this member's
            # update takes to reach its leader: every member's update then arrives about one
            # budget after the plan, and a slow member that took the plan up late does not
            # hold the round. Never past the training deadline.
            # A lateness past the budget's other three quarters used to be taken off only up to
            # a quarter: a slow node that took its first plan up 7 s late (applying its first
            # result at a tenth of a core) then trained past the budget and held a 12 s round
            # for 20 s.
            now = self.port.clock.now()
            issued = deadlines.train - book.spec.train_budget(book.recent_durations())
            end = max(issued + budget - self.send_lag_s, deadlines.received + MIN_TRAIN_SHARE * budget)
            budget = max(MIN_TRAIN_S, min(end - now, deadlines.train - now - SEND_MARGIN_S))
        round_steps = steps or book.spec.local_steps
        ahead = await self.head_start.take(r, round_steps) if self.head_start is not None else None
        start = params if self.own is None else self.own.start_for(plan, book.ledger.results, params)
        if ahead is not None and ahead.delta is not None:  # carry the steps taken ahead onto the plan's base
            start = start + ahead.delta
            steps = round_steps - ahead.steps
            if not budget:  # a job of local_steps: the rest of them, within the round's deadline
                budget = max(MIN_TRAIN_S, deadlines.train - self.port.clock.now() - SEND_MARGIN_S)
        train = functools.partial(trainer.train, server_state=control) if control else trainer.train
        delta, metrics = await self.port.offload(train, start, steps, budget)
        self._trained_at = self.port.clock.now()
        end, span = start + delta, None
        if self.head_start is not None:
            self._train_ahead(plan, trainer, end, round_steps)
        if ahead is not None and ahead.delta is not None:
            delta, metrics = delta + ahead.delta, merged_metrics(ahead, metrics)
        if self.own is not None:  # its own model carries on; it sends "trained − base" on the synced fragment
            await self.port.offload(self.own.keep, plan, end)  # a model-sized write, off the event loop
            delta, span = self.own.update(r, params, end)
        delta = self.faults.tamper(delta)
        if metrics.get("oom_retries"):
            self.port.emit(EventKind.OUT_OF_MEMORY, r, book.me, message=(
                f"round {r}: out of memory {metrics['oom_retries']:.0f}x; now micro-batches of "
                f"{metrics.get('micro_batch', 0):.0f}, same effective batch"))
        if isinstance(metrics.get("samples_per_s"), (int, float)):
            book.rates[book.me] = blend(book.rates.get(book.me), float(metrics["samples_per_s"]))
        self.port.emit(EventKind.TRAINED, r, book.me, message=(
            f"round {r}: trained {metrics.get('steps')} steps on {metrics.get('samples')} samples "
            f"in {metrics.get('seconds', 0):.2f}s"),
            samples=metrics.get("samples"), seconds=metrics.get("seconds"), steps=metrics.get("steps"))
        # The update's weight. FedNova weighs each member by the samples it saw this round (its
        # steps x batch, bounded by its plan): a member that took three steps gives a direction
        # measured on three batches, which must not count as much as one measured on thirty.
        # Otherwise the data this member holds.
        seen = metrics.get("samples")
        samples = (int(seen) if book.spec.uses_fednova and isinstance(seen, (int, float)) and seen > 0
                   else int(metrics.get("dataset_size") or trainer.num_samples))
        # Under secure aggregation this is the clear (DP-noised) delta; it is masked per
        # attempt, because the masks depend on the attempt's group and leader.
        payload = self.encoder.encode(delta, samples, span=span)
        trained = seal_update(
            self.port.identity, payload, job=book.job_id, round=r, peer=book.me, base_hash=plan.base_hash,
            plan=plan.digest, samples=samples, delta_hash=blob_hash(payload), delta_size=int(np.asarray(delta).size),
            metrics={**{k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
                     "update_bytes": float(len(payload))},
            **({"device": book.device} if book.device else {}), **self._nonces(r))
        self.cached = {k: v for k, v in self.cached.items() if k[0] >= r}
        self.cached[key] = trained

    def _nonces(self, r: int) -> dict[str, str]:
        """Secure aggregation: this round's nonce, revealed (it draws the next round's groups,
        ``placement.group_draw``), and the commitment to the next round's nonce."""
        book, sign = self.book, self.port.identity.sign
        if not book.spec.secure_aggregation:
            return {}
        return {"nonce": secagg_nonce(sign, book.job_id, r),
                "commit": nonce_commitment(secagg_nonce(sign, book.job_id, r + 1))}

    def _train_ahead(self, plan: Plan, trainer: Trainer, end: np.ndarray, round_steps: int) -> None:
        """Start the next round's first steps from ``end`` while this round's update travels
        (``gpuflex.node.ahead``); not in the last round. The round's root starts them only
        once it has committed the round (``committed``): it evaluates the new model on the
        same workload first."""
        assert self.head_start is not None
        self._pending_ahead = None
        if plan.round >= self.book.spec.rounds or round_steps < 2:
            return
        if plan.coordinator == self.book.me:
            self._pending_ahead = (plan.round, trainer, end, round_steps)
            return
        self.head_start.ready(self.port.clock.now())
        self.book.tasks.start_soon(self.head_start.run, self.port, trainer, end, plan.round + 1, round_steps)

    def committed(self, round_: int) -> None:
        """This node, as the root, committed ``round_``: its head start may begin now."""
        pending, self._pending_ahead = self._pending_ahead, None
        if self.head_start is None or pending is None or pending[0] != round_:
            return
        _, trainer, end, round_steps = pending
        self.head_start.ready(self.port.clock.now(), as_root=True)
        self.book.tasks.start_soon(self.head_start.run, self.port, trainer, end, round_ + 1, round_steps, True)

    def _sent(self) -> None:
        """Learn how long this member's update takes from the end of training to its leader."""
        if self._trained_at is None:
            return
        lag, self._trained_at = self.port.clock.now() - self._trained_at, None
        self.send_lag_s = lag if not self.send_lag_s else (1 - RATE_WEIGHT) * self.send_lag_s + RATE_WEIGHT * lag

    async def _mask(self, plan: Plan, side: SecAggMember, trained: TrainedUpdate) -> TrainedUpdate:
        """The cached clear update, masked for this attempt's group and signed again.

        The DP noise was drawn once, at training time: a retry masks the same noisy delta, so
        no one can average fresh noise away across attempts. Masking expands g - 1 PRG streams
        of the model's size, so it runs off the event loop.
        """
        up = trained.update
        # Masked in the weight the leader will fold it with: the plan's cap applies here too.
        weight = capped(up, plan.sample_cap).samples
        masked = await self.port.offload(side.encode, unpack_delta(trained.payload, up.delta_size), weight)
        self.secagg_sides = {k: v for k, v in self.secagg_sides.items() if k[0] >= plan.round}
        self.secagg_sides[(plan.round, plan.attempt, side.ctx.leader)] = side
        self.faults.after_masking(side.ctx, self.book.me)
        return seal_update(self.port.identity, masked, **{**up.env.body, "delta_hash": blob_hash(masked),
                                                          "plan": plan.digest})

    def _refuse_group(self, plan: Plan, size: int) -> None:
        """A masked update in a group this small tells its leader (or colluding partners) too
        much: with one partner, the sum minus the partner's own update is this node's."""
        need = self.book.spec.secagg_min_group
        message = (f"round {plan.round}: not sending a masked update: the group this node was placed in "
                   f"has {size} masking member(s), fewer than secagg_min_group={need}")
        log.warning("%s", message)
        self.port.emit(EventKind.SECAGG_REFUSED, plan.round, plan.coordinator, message=message)

    async def on_secagg_recover(self, msg: Inbound) -> bytes:
        """Answer this node's leader with the seed shares that unmask a group sum after a dropout."""
        if msg.gossip:  # only the leader's direct request counts; a relay is not to blame
            raise Rejected("a recovery request must come straight from its leader, not by gossip")
        req = parse_recovery_request(msg.envelope)
        current = self.book.current.round
        if req.round < current:
            raise Rejected(f"round {req.round} is already committed here")
        if req.round > current:
            raise WireError(WireReason.ROUND,
                            f"recovery request for round {req.round}, this node is at round {current}")
        side = self.secagg_sides.get((req.round, req.attempt, req.leader))
        if side is None:  # a restart lost the keys, or this node never masked for that leader
            raise Rejected(f"this node sent {req.leader[-8:]} no masked update in round {req.round} "
                           f"attempt {req.attempt}")
        reply = answer_recovery(self.port.identity, side, req)
        self.port.emit(EventKind.SECAGG_ANSWERED, req.round, req.leader, message=(
            f"round {req.round}: gave {len(req.shares)} seed shares to {req.leader[-8:]} to recover "
            f"{len(req.dropped)} dropped member(s)"))
        return reply
