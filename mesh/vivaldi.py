"""Vivaldi network coordinates: where a node sits, in milliseconds, from the RTTs it measures.

Each node keeps a coordinate (a point on a plane plus a height, the delay of its own access
link) and an error estimate. Every round trip it measures to a peer whose coordinate it knows
(liveness pings, ``mesh.liveness``) moves its coordinate a little towards where that RTT says
it should be (Dabek et al., "Vivaldi: A Decentralized Network Coordinate System", 2004).
The coordinate travels in the node's NodeInfo, so any node can estimate the RTT between two
peers it never measured: what places a round's leaders near their members
(``gpuflex.node.placement``).

Pure arithmetic, no I/O. A peer's coordinate comes from the wire, so ``from_wire`` bounds it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

#: How far one sample moves the coordinate (cc) and the error estimate (ce), as in the paper.
CC, CE = 0.25, 0.25
#: Coordinates and heights are bounded (ms): half the Earth's circumference at light speed in
#: fibre is about 100 ms one way, so this leaves room and nothing from a peer can overflow.
MAX_MS = 10_000.0
MIN_HEIGHT_MS = 0.1
#: An RTT sample outside this range says nothing about distance (a stalled peer, a clock jump).
MAX_RTT_MS = 5_000.0


@dataclass(frozen=True)
class Coordinate:
    x: float = 0.0
    y: float = 0.0
    height: float = MIN_HEIGHT_MS
    error: float = 1.0  # relative error estimate, 1 = knows nothing yet

    def rtt_to(self, other: Coordinate) -> float:
        """The round trip this coordinate predicts to ``other``, in ms."""
        return math.hypot(self.x - other.x, self.y - other.y) + self.height + other.height

    def wire(self) -> list[float]:
        return [round(self.x, 2), round(self.y, 2), round(self.height, 2), round(self.error, 3)]


def from_wire(value: object) -> Coordinate | None:
    """A peer's coordinate as its NodeInfo states it, or None if it is not a bounded one."""
    if not isinstance(value, list) or len(value) != 4:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        return None
    x, y, h, e = (float(v) for v in value)
    if max(abs(x), abs(y), h) > MAX_MS or h < 0 or not 0 <= e <= 1.0:
        return None
    return Coordinate(x, y, max(h, MIN_HEIGHT_MS), e)


def observe(own: Coordinate, remote: Coordinate, rtt_ms: float, rng: random.Random | None = None) -> Coordinate:
    """``own`` moved by one RTT sample to a peer at ``remote`` (the paper's update with heights)."""
    if not 0 < rtt_ms < MAX_RTT_MS:
        return own
    weight = own.error / max(own.error + remote.error, 1e-9)
    predicted = own.rtt_to(remote)
    sample_error = abs(predicted - rtt_ms) / rtt_ms
    error = min(1.0, sample_error * CE * weight + own.error * (1 - CE * weight))
    step = CC * weight * (rtt_ms - predicted)  # > 0: too close, move away
    dx, dy = own.x - remote.x, own.y - remote.y
    dist = math.hypot(dx, dy)
    if dist < 1e-6:  # same point: push in a random direction, so that two nodes can part
        angle = (rng or random).random() * 2 * math.pi
        dx, dy, dist = math.cos(angle), math.sin(angle), 1.0
    plane = dist + own.height + remote.height
    x = own.x + step * dx / plane
    y = own.y + step * dy / plane
    height = own.height + step * own.height / plane
    clamp = lambda v: max(-MAX_MS, min(MAX_MS, v))  # noqa: E731
    return Coordinate(clamp(x), clamp(y), min(MAX_MS, max(MIN_HEIGHT_MS, height)), max(error, 0.01))
