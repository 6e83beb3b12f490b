"""Preparing one job on this node: its ledger, its part of the data, the device it trains on.

Preparing takes from a fraction of a second to many (a slow machine loading its data and
measuring its throughput). Meanwhile the node can hold no coordinator turn: a peer whose turn
comes would wait a plan timeout for its plan, and once ready it would root the round at its own
pace. So a node still preparing after ``PASS_TURNS_AFTER_S``, when an eligible peer has the job
ready, passes its turns in the current round and says so in presence; its peers skip those
turns on that word (``Turns.skipped``), and it skips them too, so both agree.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.messages import JOB, created_at
from gpuflex.node.core.modelblob import model_parts
from gpuflex.node.core.workfields import DEVICE_CHARS
from gpuflex.node.core.workplan import valid_rate
from gpuflex.node.faults import Faults
from gpuflex.node.port import JobPort, Trainer, TrainerFactory
from gpuflex.node.state import JobBook
from mesh.codec import WireError, open_envelope

log = logging.getLogger("gpuflex.rounds")
#: A node still preparing a job this long after loading its ledger, while a peer has it ready,
#: passes its coordinator turns in the current round: nodes preparing side by side do not.
PASS_TURNS_AFTER_S = 0.5
#: A job published longer ago than this, with no ledger here, is caught up (for at most
#: ``CATCH_UP_FIRST_S``) before it is prepared: its peers may hold rounds, or its end.
CATCH_UP_FIRST_AFTER_S, CATCH_UP_FIRST_S = 10.0, 8.0


def load_trainer(spec: Any, index: int, parts: int, home: Path, data_hook: Callable[..., Any] | None,
                 config: Any = None) -> Trainer:
    """The real workload (torch), imported only when a job starts: a language model's or the
    classic one, behind the same flat-vector surface, with torch's first optimizer step paid
    (``warm_up_torch``). ``config``: the node's NodeConfig for this run (its data locations),
    read from ``home`` when None."""
    from gpuflex.ml.warmup import warm_up_torch
    from gpuflex.ml.workload import open_workload

    workload = open_workload(spec, index, parts, home, data_hook=data_hook, config=config)
    warm_up_torch()  # before the node is ready: not inside the first round's deadline
    return workload


class Preparation:
    """Prepares the job once (``run``); ``trainer`` is its workload from when it is built."""

    def __init__(self, port: JobPort, book: JobBook, trainers: TrainerFactory, faults: Faults) -> None:
        self.port, self.book, self._trainers, self._faults = port, book, trainers, faults
        self.trainer: Trainer | None = None
        self._init: Any = None  # round 0's model, until its size is said (``_size``)

    async def run(self) -> None:
        book, port = self.book, self.port
        problems = book.ledger.load()
        for problem in problems:
            port.emit(EventKind.STATE_CORRUPT, message=f"ledger of job {book.job_id}: {problem}; recovering")
        book.advance()
        book.loaded = True
        late = not book.ledger.results and self._long_running()
        if late:
            # A job that began a while ago and has no ledger here: this node joined late. Wait
            # for peers' ledger before fitting (at most CATCH_UP_FIRST_S), so a job that has
            # finished is not fitted to the device nor given turns it no longer has. The model
            # is built first: its size bounds the model blobs that adopting the ledger fetches.
            await self._build()
            self._size()
            await port.catch_up()
            await book.changed.wait_for(lambda: bool(book.ledger.results), trio.current_time() + CATCH_UP_FIRST_S)
        passing = trio.CancelScope()
        book.tasks.start_soon(self._pass_turns, passing)
        try:
            if not late:
                await self._build()
            await self._fit_to_device()
        finally:
            passing.cancel()
        if problems or (book.ledger.results and not port.blobs.has(book.head_model)):
            await port.catch_up()
        book.ready.set()
        # Say so at once: a peer still preparing passes its turns in this round to a ready one,
        # and a time-budgeted job's coordinator plans only members with a measured throughput.
        port.announce_soon()

    def _long_running(self) -> bool:
        """Whether the job was published more than ``CATCH_UP_FIRST_AFTER_S`` ago (its signed
        creation time; a skewed clock only decides whether the ledger is asked for first)."""
        try:
            created = created_at(open_envelope(self.book.info.frame, expect_kind=JOB))
        except WireError:
            return False
        # The deadline clock's wall (the real one, or a simulator's modelled one): read off the
        # real clock, a simulated job looked old to nodes it reached many real seconds later,
        # and one node in ten at 300 and 1,000 nodes caught up for 8 s before round 1.
        return created > 0 and self.port.clock.wall() - created > CATCH_UP_FIRST_AFTER_S  # 0: no time was signed

    async def _build(self) -> None:
        """Load this node's part of the data and build the model; its size bounds the model
        blobs this job may fetch (``Models.blob_limit``)."""
        book, port = self.book, self.port
        index, parts = book.info.part_for(book.me)
        self.trainer = trainer = await port.offload(self._trainers, book.spec, index, parts, port.home,
                                                    self._faults.data_hook())
        self._init = await port.offload(trainer.initial_params)

    def _size(self) -> None:
        """Say the model's size (what its blobs may weigh) and keep round 0's model."""
        book = self.book
        if book.sized.is_set() or self._init is None:
            return
        book.model_size = int(self._init.size)
        book.sized.set()
        book.init_hash = self.port.blobs.put_parts(model_parts(self._init, {}))
        self._init = None

    async def _fit_to_device(self) -> None:
        """Fit the job to the device and measure throughput."""
        book, port, trainer = self.book, self.port, self.trainer
        assert trainer is not None
        # A node that joins after the last round takes the final ledger (usually while its
        # workload loads): nothing to train, so no device to fit and nothing to announce.
        if book.finished:
            return
        fitted = await port.offload(trainer.fitted)  # device, precision, measured throughput
        if book.finished:
            return
        book.device = str(fitted.get("device", ""))[:DEVICE_CHARS]
        book.fit = {k: v for k, v in fitted.items() if isinstance(v, (int, float, str)) or v is None}
        if (rate := valid_rate(fitted.get("samples_per_s"))) is not None:
            book.rates[book.me] = rate
        settings: dict[str, Any] = {k: v for k, v in book.fit.items()
                                    if v is not None and k not in ("peer", "message")}
        port.emit(EventKind.DEVICE_FITTED,
                  message=f"job {book.job_id}: training on {fitted.get('summary', book.device)}", **settings)
        self._size()

    async def _pass_turns(self, scope: trio.CancelScope) -> None:
        """Pass this round's coordinator turns once ``PASS_TURNS_AFTER_S`` has passed and an
        eligible peer has the job ready (``JobBook.pass_turns``); cancelled when ready."""
        book = self.book
        with scope:
            await trio.sleep(PASS_TURNS_AFTER_S)
            # A finished job has no turns left to pass (a node that joined after its end).
            await book.changed.wait_for(lambda: not book.finished and book.pass_turns(), math.inf)
        if scope.cancelled_caught:
            return
        log.info("job %s: still preparing while a peer is ready: this node passes its coordinator turns "
                 "in round %d", book.job_id, book.passed_round)
        self.port.announce_soon()
