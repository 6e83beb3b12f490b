"""Keeping the dashboard's picture of the node fresh without ever blocking the UI.

Two loops run as Textual workers: one polls status, peers and jobs (at most once per
``interval``, and right after an event so pushed changes show at once), one follows the event
stream. Neither knows about widgets; they hand immutable Snapshots and Events to callbacks,
which keeps the retry logic testable on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuflex.serve.view import Serving
from tui.model import Event, Job, Peer, Status, as_list
from tui.source import DataSource


@dataclass(frozen=True)
class Snapshot:
    """Everything the screens draw from, replaced whole on every poll.

    ``connected`` is None until the first poll has finished, so the first frame can say
    "connecting" rather than claim a disconnect that has not happened.
    """

    status: Status | None = None
    peers: tuple[Peer, ...] = ()
    jobs: tuple[Job, ...] = ()
    connected: bool | None = None
    error: str = ""
    attempts: int = 0
    where: str = ""
    polled_at: float | None = field(default=None, compare=False)
    serving: Serving = field(default_factory=Serving)  # the ``serve`` block of status


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


class Feed:
    def __init__(
        self,
        source: DataSource,
        on_snapshot: Callable[[Snapshot], None],
        on_event: Callable[[Event], None],
        interval: float = 1.0,
        timeout: float = 5.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.on_snapshot = on_snapshot
        self.on_event = on_event
        self.interval = interval
        self.timeout = timeout
        self.wall_clock = wall_clock
        self.snapshot = Snapshot(where=source.describe())
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Ask for an early poll; the loop still waits out ``interval`` since the last one."""
        self._wake.set()

    async def poll_once(self) -> Snapshot:
        """One round of requests. The whole round has a deadline on top of the source's own,
        so a source that hangs (or a fake in a test) cannot stall the screen's data."""
        try:
            status, peers, jobs, serving = await asyncio.wait_for(self._fetch(), self.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            snap = Snapshot(
                self.snapshot.status,
                self.snapshot.peers,
                self.snapshot.jobs,
                connected=False,
                error=_reason(exc),
                attempts=self.snapshot.attempts + 1,
                where=self.source.describe(),
                polled_at=self.snapshot.polled_at,
                serving=self.snapshot.serving,
            )
        else:
            snap = Snapshot(
                status,
                peers,
                jobs,
                connected=True,
                where=self.source.describe(),
                polled_at=self.wall_clock(),
                serving=serving,
            )
        self.snapshot = snap
        self.on_snapshot(snap)
        return snap

    async def _fetch(self) -> tuple[Status, tuple[Peer, ...], tuple[Job, ...], Serving]:
        raw_status = await self.source.status()
        status = Status.parse(raw_status)
        raw_peers = await self.source.peers()
        raw_jobs = await self.source.jobs()
        peers = tuple(Peer.parse(p) for p in as_list(raw_peers))
        jobs = tuple(Job.parse(j) for j in as_list(raw_jobs))
        return status, peers, jobs, Serving.from_status(raw_status)

    async def poll_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            self._wake.clear()
            await self.poll_once()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            # However often events poke us, keep to one poll per interval.
            await asyncio.sleep(max(0.0, started + self.interval - loop.time()))

    async def follow_events(self) -> None:
        """Subscribe, and subscribe again whenever the stream ends or fails, so a flaky
        source never loses the log for good."""
        while True:
            try:
                stream = self.source.events()
                try:
                    async for raw in stream:
                        self.on_event(Event.parse(raw))
                        self.poke()
                finally:
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:
                        await aclose()
            except asyncio.CancelledError:
                raise
            except Exception:
                pass
            await asyncio.sleep(self.interval)
