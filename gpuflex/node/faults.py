"""The one seam through which a node's behaviour can be made faulty on purpose.

Robustness tests need nodes that misbehave: poisoned updates (``--adversary``, refused unless
the node listens on loopback only) and members that die at a point no outside kill can hit
reliably (right after masking under secure aggregation). None of that lives in the round
protocol itself: the member calls these hooks, and a normal node's hooks do nothing.

Only two things install other hooks: the ``--adversary`` flag (through the runtime), and
test harnesses, which call :func:`install` before starting a node. Nothing from the wire,
the environment or a job file can.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from gpuflex.node.core.secure import GroupContext


class Faults(Protocol):
    """Hooks the member calls at the points a fault can be injected."""

    def tamper(self, delta: np.ndarray) -> np.ndarray:
        """The delta this node sends instead of the one it trained."""
        ...

    def data_hook(self) -> Callable[..., Any] | None:
        """Wraps this node's training set (label flipping), or None."""
        ...

    def after_masking(self, ctx: GroupContext, me: str) -> None:
        """Called once this node's update is masked for ``ctx``, before it is sent."""
        ...


class NoFaults:
    """A normal node."""

    def tamper(self, delta: np.ndarray) -> np.ndarray:
        return delta

    def data_hook(self) -> Callable[..., Any] | None:
        return None

    def after_masking(self, ctx: GroupContext, me: str) -> None:
        return None


NO_FAULTS: Faults = NoFaults()
_installed: Faults | None = None


def install(faults: Faults) -> None:
    """Test harnesses only: every node this process starts from now on uses ``faults``."""
    global _installed
    _installed = faults


def installed() -> Faults | None:
    """The hooks a test harness installed, if any."""
    return _installed
