"""One shared, fresh picture of the node for every page and every live browser tab.

A single Hub per portal polls ``status``, ``peers`` and ``jobs`` (and a job's ``ledger`` only
when its round moved) at most once per ``interval`` (1 s by default, never faster), and only
while someone is watching: an open live stream, or a page served in the last ``idle_after``
seconds. It also follows the node's event stream for the overview's log. However many tabs
are open, the node sees one poller, and each tab gets each new Snapshot once.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from gpuflex.serve.view import Serving
from gpuflex_web.model import Event, Job, LedgerRound, Peer, Status, as_list
from gpuflex_web.source import NodeRefused, NodeUnavailable, Source

RETRY_DELAYS = (1.0, 2.0, 2.0, 3.0)
#: On a failed poll the last data stays on screen (marked stale) only if it is younger than
#: this: a picture from minutes ago (an idle portal across a node restart) says nothing true.
STALE_AFTER_S = 30.0


@dataclass(frozen=True)
class Snapshot:
    """Everything the pages draw from, replaced whole on every poll.

    ``connected`` is None until the first poll ends, so a page can say "connecting" instead
    of claiming a disconnect that has not happened. On a failed poll the last data stays, shown
    as stale under the "disconnected, retrying" banner.
    """

    status: Status | None = None
    peers: tuple[Peer, ...] = ()
    jobs: tuple[Job, ...] = ()
    ledgers: Mapping[str, tuple[LedgerRound, ...]] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    connected: bool | None = None
    error: str = ""
    attempts: int = 0
    retry_in: float = 0.0
    where: str = ""
    polled_at: float | None = None
    version: int = 0
    serving: Serving = field(default_factory=Serving)  # the ``serve`` block of status

    def job(self, job_id: str) -> Job | None:
        return next((j for j in self.jobs if j.job_id == job_id), None)

    @property
    def current_job(self) -> Job | None:
        """The job the overview follows: the newest running one, else the newest."""
        return next((j for j in self.jobs if j.state == "running"), self.jobs[0] if self.jobs else None)


class Hub:
    def __init__(self, source: Source, interval: float = 1.0, idle_after: float = 30.0,
                 max_jobs: int = 50, max_events: int = 40,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.interval = max(1.0, interval)
        self.idle_after = idle_after
        self.max_jobs = max_jobs
        self.wall_clock = wall_clock
        self.snapshot = Snapshot(where=source.describe())
        self._events: deque[Event] = deque(maxlen=max_events)
        self._ledger_rounds: dict[str, int] = {}
        self._watchers = 0
        self._last_demand = -1e9
        self._last_poll = -1e9
        self._lock = trio.Lock()
        self._changed = trio.Event()
        self._demand = trio.Event()

    # -- for pages and live streams ---------------------------------------------------------

    async def fresh(self) -> Snapshot:
        """The snapshot, polled first unless the last poll is under ``interval`` old. A poll in
        flight is waited for (poll_once takes the lock), so a page never shows older data."""
        self._note_demand()
        return await self.poll_once()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Keep polling while a live stream is open."""
        self._watchers += 1
        self._note_demand()
        try:
            yield
        finally:
            self._watchers -= 1

    async def wait_newer(self, version: int, timeout: float) -> Snapshot:
        """The next snapshot after ``version``, or the current one when ``timeout`` passes."""
        with trio.move_on_after(timeout):
            while self.snapshot.version <= version:
                await self._changed.wait()
        return self.snapshot

    def _note_demand(self) -> None:
        self._last_demand = trio.current_time()
        self._demand.set()

    def _watched(self) -> bool:
        return self._watchers > 0 or trio.current_time() - self._last_demand < self.idle_after

    # -- polling ------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_events)
            task_status.started()
            while True:
                if not self._watched():
                    self._demand = trio.Event()
                    await self._demand.wait()
                started = trio.current_time()
                if started - self._last_poll >= self.interval:
                    await self.poll_once()
                snap = self.snapshot
                delay = self.interval if snap.connected else snap.retry_in
                await trio.sleep_until(max(self._last_poll, started) + max(self.interval, delay))

    async def poll_once(self) -> Snapshot:
        async with self._lock:
            if trio.current_time() - self._last_poll < self.interval:
                return self.snapshot  # another caller polled while this one waited
            self._last_poll = trio.current_time()
            try:
                status, peers, jobs, ledgers, serving = await self._fetch()
            except (NodeUnavailable, NodeRefused) as exc:
                prev = self.snapshot
                if prev.polled_at is not None and self.wall_clock() - prev.polled_at > STALE_AFTER_S:
                    prev = replace(Snapshot(), attempts=prev.attempts)
                attempts = prev.attempts + 1
                self._publish(replace(
                    prev, connected=False, error=str(exc), attempts=attempts,
                    retry_in=RETRY_DELAYS[min(attempts, len(RETRY_DELAYS)) - 1],
                    where=self.source.describe(), events=tuple(self._events)))
            else:
                self._publish(Snapshot(
                    status=status, peers=peers, jobs=jobs, ledgers=ledgers,
                    events=tuple(self._events), connected=True, where=self.source.describe(),
                    polled_at=self.wall_clock(), serving=serving))
            return self.snapshot

    async def _fetch(self) -> tuple[Status, tuple[Peer, ...], tuple[Job, ...],
                                    dict[str, tuple[LedgerRound, ...]], Serving]:
        raw_status = await self.source.call("status")
        status = Status.parse(raw_status)
        peers = tuple(Peer.parse(p) for p in as_list(await self.source.call("peers")))
        jobs = tuple(Job.parse(j) for j in as_list(await self.source.call("jobs"))[: self.max_jobs])
        old = self.snapshot.ledgers
        ledgers: dict[str, tuple[LedgerRound, ...]] = {}
        for job in jobs:
            if job.job_id in old and self._ledger_rounds.get(job.job_id) == job.round:
                ledgers[job.job_id] = old[job.job_id]
                continue
            try:
                raw = await self.source.call("ledger", {"job": job.job_id})
            except NodeRefused:
                raw = []
            ledgers[job.job_id] = tuple(LedgerRound.parse(r) for r in as_list(raw))
            self._ledger_rounds[job.job_id] = job.round
        return status, peers, jobs, ledgers, Serving.from_status(raw_status)

    def _publish(self, snap: Snapshot) -> None:
        self.snapshot = replace(snap, version=self.snapshot.version + 1)
        self._changed.set()
        self._changed = trio.Event()

    async def _follow_events(self) -> None:
        """The event log, across reconnects (the source retries); shown on the next poll."""
        while True:
            with contextlib.suppress(NodeUnavailable, NodeRefused):
                async with contextlib.aclosing(self.source.events()) as stream:
                    async for raw in stream:
                        self._events.appendleft(Event.parse(raw))
            await trio.sleep(self.interval)
