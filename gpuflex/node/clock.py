"""The one place where a protocol deadline crosses between the wire and this process.

Deadlines inside a node run on trio's clock (``trio.current_time()``), so a whole round can run
under ``trio.testing.MockClock``. A plan, though, travels to other machines, whose trio clocks
share no origin with ours: there a deadline is wall-clock seconds since the epoch. This class
converts between the two, and nothing else in the protocol reads the wall clock for a
deadline. Timestamps that leave the process for people (events, logs, the ledger's metrics)
use the wall clock directly, as they should.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio


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

    def to_wire(self, local_deadline: float) -> float:
        """A local trio deadline, as wall-clock seconds for a message."""
        return self.wall() + (local_deadline - trio.current_time())

    def since_wall(self, wall_ts: float) -> float:
        """Seconds since a wall-clock timestamp (a signed message's ``ts``), for metrics."""
        return self.wall() - wall_ts
