"""Training ahead while an update travels: the one-round-delayed outer step.

Why: on a home uplink a member spends much of a round sending its update and waiting for the
round's result while its accelerator idles. With ``overlap`` > 0 in the job file, a member
starts the next round's local steps from where its own training ended as soon as its update
is sealed, as Streaming DiLoCo overlaps the outer sync with the next inner steps. When the
next plan arrives, the steps already taken are carried onto the plan's base model and the
member trains only the rest of the round's steps.

The ledger stays exact: the update a member signs is still "trained parameters − the plan's
base model", checked against the base hash like any other, so every committed model is the
hash-checked result of signed updates. What changes is only where some gradients were taken:
up to ``overlap`` of a round's steps see parameters one outer step stale.

The node that roots a round trains ahead only once the round is committed: it evaluates the
new model on the same workload right after the reduce, and must not wait for its own head
start to do so.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio

from gpuflex.node.port import JobPort, Trainer
from gpuflex.node.workplan import RATE_WEIGHT

log = logging.getLogger("gpuflex.ahead")

#: A head start uses at most this share of the time this member waited, in recent rounds,
#: from the end of its training to the next plan: the next round should not wait for it.
GAP_SHARE = 0.8


@dataclass
class Ahead:
    """Steps trained for a round before its plan arrived."""

    round: int
    done: trio.Event = field(default_factory=trio.Event)
    delta: np.ndarray | None = None  # trained − where it started (the previous round's end)
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.metrics.get("steps") or 0)


class HeadStart:
    """One member's training ahead, one round at a time.

    It learns how long this member usually waits from the moment it may start training ahead
    (the end of its training; for the round's root, its commit) to the next plan, apart for
    the two cases, and trains ahead for at most ``GAP_SHARE`` of that and at most ``share``
    of the round's steps, so the head start ends before the plan is expected.
    """

    def __init__(self, share: float) -> None:
        self.share = share
        self.gaps: dict[bool, float] = {False: 0.0, True: 0.0}  # as the round's root or not: recent waits
        self._ready: tuple[float, bool] | None = None
        self._ahead: Ahead | None = None

    def gap_s(self, as_root: bool = False) -> float:
        return self.gaps[as_root]

    def ready(self, now: float, as_root: bool = False) -> None:
        """This member could start training ahead now: its training ended (as a member), or
        the round it rooted is committed (as the root)."""
        self._ready = (now, as_root)

    def plan_arrived(self, now: float) -> None:
        """A plan for a later round reached this member: learn the gap it waited."""
        if self._ready is None:
            return
        (since, as_root), self._ready = self._ready, None
        gap, known = max(0.0, now - since), self.gaps[as_root]
        self.gaps[as_root] = gap if not known else (1 - RATE_WEIGHT) * known + RATE_WEIGHT * gap

    def steps_for(self, round_steps: int) -> int:
        """How many of a round's steps this member may take before its plan."""
        return max(0, min(round_steps - 1, math.floor(round_steps * self.share)))

    async def run(self, port: JobPort, trainer: Trainer, start: np.ndarray, next_round: int,
                  round_steps: int, as_root: bool = False) -> None:
        """Train ``next_round``'s first steps from ``start`` (this member's trained parameters).

        Nothing happens before the gap is known (the first round) or when the round has too
        few steps to share; a failure only means the next round trains all its steps."""
        steps, limit = self.steps_for(round_steps), GAP_SHARE * self.gaps[as_root]
        if steps < 1 or limit <= 0:
            return
        self._ahead = ahead = Ahead(next_round)
        try:
            delta, metrics = await port.offload(trainer.train, start, steps, limit)
            ahead.delta, ahead.metrics = delta, dict(metrics)
        except Exception as exc:  # user code may raise anything: the round then trains in full
            log.warning("round %d: training ahead failed, the round trains all its steps: %s", next_round, exc)
        finally:
            ahead.done.set()

    async def take(self, round_: int, round_steps: int) -> Ahead | None:
        """The head start for ``round_``, once it has ended; None if there is none, it was
        for another round, or it took so many steps that none would be left for the plan."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead.round != round_:
            return None
        await ahead.done.wait()
        if ahead.delta is None or not 1 <= ahead.steps < round_steps:
            return None
        return ahead


def merged_metrics(ahead: Ahead, metrics: dict[str, Any]) -> dict[str, Any]:
    """One round's training metrics from its head start and the rest: steps, samples and
    seconds add up; the loss is the later part's; ``ahead_steps`` says how many came first."""
    out = dict(metrics)
    for key in ("steps", "samples", "seconds", "tokens"):
        if isinstance(metrics.get(key), (int, float)) and isinstance(ahead.metrics.get(key), (int, float)):
            out[key] = metrics[key] + ahead.metrics[key]
    seconds = out.get("seconds")
    if isinstance(seconds, (int, float)) and seconds > 0 and isinstance(out.get("samples"), (int, float)):
        out["samples_per_s"] = out["samples"] / seconds
    out["ahead_steps"] = ahead.steps
    out["ahead_seconds"] = float(ahead.metrics.get("seconds") or 0.0)
    return out
