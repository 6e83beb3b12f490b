"""The one place where a protocol deadline crosses between the wire and this process.

Deadlines inside a node run on trio's clock (``trio.current_time()``), so a whole round can run
under ``trio.testing.MockClock``. A plan, though, travels to other machines, whose trio clocks
share no origin with ours: there a deadline is wall-clock seconds since the epoch. This class
converts between the two, and nothing else in the protocol reads the wall clock for a
deadline. Timestamps that leave the process for people (events, logs, the ledger's metrics)
use the wall clock directly, as they should.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio

from mesh.codec import WireError, WireReason

#: Machines' wall clocks disagree by this much at most (as far as a deadline is concerned).
MAX_CLOCK_SKEW_S = 30.0


class DeadlineClock:
    """Converts deadlines between the wall clock (the wire) and trio's clock (this process).

    ``wall`` is injectable so tests under a mock clock can tie the two together.
    """

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall

    @staticmethod
    def now() -> float:
        """trio's clock: what every local deadline is measured against."""
        return trio.current_time()

    def to_local(self, wall_deadline: float) -> float:
        """A deadline from the wire, as a trio time."""
        return trio.current_time() + (wall_deadline - self.wall())

    def bounded_local(self, wall_deadline: float, longest_s: float, what: str = "deadline") -> float:
        """A peer's deadline as a trio time, refused (WireError) unless it is a finite time no
        further ahead than ``longest_s`` (the job's own limit) plus the clock skew allowed.
        Every deadline that arrives on the wire passes here: a plan's training deadline of
        year 3000 would otherwise hold a round open until then."""
        if not math.isfinite(wall_deadline):
            raise WireError(WireReason.GARBLED, f"{what} is not a finite time")
        ahead = wall_deadline - self.wall()
        if ahead > longest_s + MAX_CLOCK_SKEW_S:
            raise WireError(WireReason.ROUND, f"{what} is {ahead:.0f}s away; the job allows {longest_s:.0f}s")
        return trio.current_time() + ahead

    @staticmethod
    def bounded_span(seconds: float, longest_s: float, what: str = "interval") -> float:
        """A peer's duration (a reduce slack), refused unless within [0, ``longest_s``]."""
        if not math.isfinite(seconds) or not 0 <= seconds <= longest_s + 1e-9:
            raise WireError(WireReason.ROUND, f"{what} of {seconds:g}s is outside the job's [0, {longest_s:g}]s")
        return seconds

    def to_wire(self, local_deadline: float) -> float:
        """A local trio deadline, as wall-clock seconds for a message."""
        return self.wall() + (local_deadline - trio.current_time())

    def since_wall(self, wall_ts: float) -> float:
        """Seconds since a wall-clock timestamp (a signed message's ``ts``), for metrics."""
        return self.wall() - wall_ts


class Notifier:
    """Wakes every waiter when job state changes (a plan, a result, a peer's health)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self, until: float) -> None:
        """Until the next change, or trio time ``until``."""
        with trio.move_on_at(until):
            await self._event.wait()

    async def wait_for(self, predicate: Callable[[], bool], until: float) -> bool:
        """Until ``predicate`` holds (True) or trio time ``until`` passes (False)."""
        while not predicate():
            if trio.current_time() >= until:
                return False
            await self.wait(until)
        return True
