"""The reduce side of a round at one tree node (a group leader, or the root).

It folds each verified update or child partial into a running weighted sum the moment it
arrives, so reduction overlaps with stragglers still training, and it finishes as soon as
every direct child has reported or its deadline passes. Updates that arrive by failover from
deeper in the tree (their own leader died, or could not be reached) are accepted as well, so
their work is not lost; the nodes they went past are told (``Taken``), so that they stop
waiting for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio

from aggregation.sparse import SparseVector
from aggregation.tree import children
from gpuflex.node.core.messages import Partial, Plan, Update, capped
from gpuflex.node.core.pipeline import Reducer
from gpuflex.node.core.secure import Folded


def subtree_height(parent: dict[str, str | None], node: str) -> int:
    kids = children(parent, node)
    return 0 if not kids else 1 + max(subtree_height(parent, k) for k in kids)


def descendants(parent: dict[str, str | None], node: str) -> set[str]:
    out: set[str] = set()
    stack = list(children(parent, node))
    while stack:
        cur = stack.pop()
        out.add(cur)
        stack.extend(children(parent, cur))
    return out


def ancestors(parent: dict[str, str | None], node: str) -> list[str]:
    chain: list[str] = []
    cur = parent.get(node)
    while cur is not None and len(chain) <= len(parent):
        chain.append(cur)
        cur = parent.get(cur)
    return chain


@dataclass
class Collector:
    """One tree node's reduce state for one plan; ``deadline`` is the trio time at which it
    stops waiting for children (see ``RoundDeadlines.reduce_by`` and ``height``)."""

    plan: Plan
    me: str
    acc: Reducer
    deadline: float
    on_done: Callable[[], None] = lambda: None  # wakes whoever waits for the reduce to finish
    expected: set[str] = field(init=False)
    allowed: set[str] = field(init=False)
    updates: list[Update] = field(default_factory=list)
    partials: list[Partial] = field(default_factory=list)
    within: list[Update] = field(default_factory=list)  # the updates the partials carry, verified
    reported: set[str] = field(default_factory=set)
    covered: set[str] = field(default_factory=set)
    samples: int = 0
    done: trio.Event = field(default_factory=trio.Event)
    closed: bool = False

    def __post_init__(self) -> None:
        self.expected = set(children(self.plan.parent, self.me)) | {self.me}
        self.allowed = descendants(self.plan.parent, self.me) | {self.me}

    @property
    def height(self) -> int:
        """Tree levels below this node: each gets one reduce slack after the training deadline."""
        return subtree_height(self.plan.parent, self.me)

    def accepts(self, peer: str) -> bool:
        return not self.closed and peer in self.allowed and peer not in self.covered

    def _fold(self, reporter: str, vector: Folded, samples: int, covers: set[str]) -> None:
        self.acc.add(vector, float(samples), reporter)
        self.samples += samples
        self.covered |= covers
        self.reported.add(reporter)
        if self.expected <= self.reported:
            self.done.set()
            self.on_done()

    def add_update(self, update: Update, delta: Folded) -> None:
        """Fold a verified update, weighing at most the plan's sample cap (``capped``)."""
        update = capped(update, self.plan.sample_cap)
        self.updates.append(update)
        self._fold(update.peer, delta, update.samples, {update.peer})

    def add_partial(self, partial: Partial, delta: np.ndarray | SparseVector, ups: list[Update]) -> None:
        """Fold a verified partial; ``ups``: the updates it carries, as its check walked them."""
        self.partials.append(partial)
        self.within.extend(ups)
        self._fold(partial.leader, delta, partial.samples, {u.peer for u in ups} | {partial.leader})

    def child_down(self, child: str) -> None:
        """A dead child's own children fail over to this node: wait for them instead."""
        self.reported.add(child)
        self.expected |= set(children(self.plan.parent, child))
        if self.expected <= self.reported:
            self.done.set()

    def taken_above(self, peers: set[str]) -> set[str]:
        """An ancestor folded ``peers``' work itself (it went past this node): stop waiting for
        them, and refuse them from now on, so this node's partial does not overlap what the
        ancestor holds. Returns those of them already folded here: their work reached both."""
        both = peers & self.covered
        gone = peers - self.covered - {self.me}
        self.allowed -= gone
        self.reported |= gone & self.expected
        if gone and self.expected <= self.reported and not self.done.is_set():
            self.done.set()
            self.on_done()
        return both

    @property
    def progress(self) -> float:
        return len(self.reported & self.expected) / max(1, len(self.expected))


@dataclass
class Reduced:
    """What a leader folded for one plan: the combined delta and the evidence behind it."""

    avg: np.ndarray | None  # None when secure aggregation lost the masked sum and nothing is left
    updates: list[Update]  # signed updates folded here directly
    partials: list[Partial]  # signed partials of child leaders
    samples: int
    group_reports: list[dict[str, Any]] = field(default_factory=list)  # secure-aggregation group reports
    within: list[Update] = field(default_factory=list)  # the updates the partials carry

    @property
    def contributions(self) -> list[Update]:
        """Every update this reduce counts, each verified once on arrival: nothing is parsed again."""
        return [*self.updates, *self.within]
