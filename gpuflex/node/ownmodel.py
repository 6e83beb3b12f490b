"""A member's own model under a fragment-wise outer sync (job option ``fragments`` > 1).

Why: a round syncs one fragment of the model (``aggregation.fragments``), so the committed
model changes only there. A member that started each round from the committed model would
throw away, every round, what it trained into the fragments not synced: its own model carries
on instead. A round starts from the model this member ended its last training with, every
fragment synced since then replaced by the committed values (Streaming DiLoCo's merge, mixing
0), and sends the synced fragment's pseudo-gradient, "trained − the plan's base model" on that
fragment: the committed model's values there are the ones set at its last sync, so the signed
update is checked against the base hash like any other and the ledger stays exact.

The own model is written atomically to the job's directory after every training, with the
round and base model it was trained from, so a restarted member carries on from it. It is used
only when the ledger this node holds continued from that base model; a member that joined
late, whose file is missing or damaged, or whose ledger moved to another branch starts from
the committed model, which is always correct, only slower to learn the other fragments.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from aggregation.errors import AggregationError
from aggregation.fragments import Span, round_span, synced_since
from mesh.fsutil import atomic_write

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpuflex.node.core.messages import Plan, Result

log = logging.getLogger("gpuflex.ownmodel")
#: A member's own model, in its job's directory.
OWN_MODEL_FILE = "own-model.f32"
#: The file's header (round and base model hash as JSON) is at most this long.
MAX_HEADER_BYTES = 512


@dataclass(frozen=True)
class Own:
    """The model this member ended round ``round`` with, trained from ``base_hash``."""

    round: int
    base_hash: str
    params: np.ndarray


class OwnModel:
    """One member's own model of one job, and where each round's training starts."""

    def __init__(self, path: Path, fragments: int) -> None:
        self.path, self.fragments = path, fragments
        self._own = self._read()
        self._started: tuple[int, str, np.ndarray] | None = None  # a round's start, for its retries

    def _read(self) -> Own | None:
        if not self.path.is_file():
            return None
        try:
            data = self.path.read_bytes()
            head, _, body = data.partition(b"\n")
            meta = json.loads(head) if 0 < len(head) <= MAX_HEADER_BYTES else None
            if not isinstance(meta, dict) or not isinstance(meta.get("round"), int) \
                    or not isinstance(meta.get("base"), str) or not body or len(body) % 4:
                raise ValueError("bad header or body")
            return Own(meta["round"], meta["base"], np.frombuffer(body, dtype="<f4").astype(np.float32))
        except (OSError, ValueError) as exc:
            log.warning("own model %s is unreadable (%s); the next round starts from the committed model",
                        self.path, exc)
            return None

    def start_for(self, plan: Plan, results: Sequence[Result], base: np.ndarray) -> np.ndarray:
        """Where this member's training for ``plan`` starts: its own model with the
        fragments synced since it was trained taken from ``base`` (the plan's base model), or
        ``base`` itself when the own model does not continue this ledger."""
        r = plan.round
        if self._started is not None and self._started[:2] == (r, plan.base_hash):
            return self._started[2].copy()  # a retried attempt trains from the same start
        own, start = self._own, base
        if own is not None and self._continues(own, plan, results, base):
            try:
                start = synced_since(own.params, base, self.fragments, own.round, r - 1)
            except AggregationError as exc:
                log.warning("round %d: own model not merged (%s); starting from the committed model", r, exc)
        self._started = (r, plan.base_hash, start)
        return start.copy()

    @staticmethod
    def _continues(own: Own, plan: Plan, results: Sequence[Result], base: np.ndarray) -> bool:
        """The own model was trained in an earlier round from the model this ledger continued
        from then, and the plan builds on this ledger's head."""
        r = plan.round
        return (1 <= own.round < r <= len(results) + 1 and own.params.size == base.size
                and results[own.round - 1].base_hash == own.base_hash
                and (r == 1 or results[r - 2].model_hash == plan.base_hash))

    def keep(self, plan: Plan, params: np.ndarray) -> None:
        """Hold (and write, atomically) the model this member's training for ``plan`` ended with."""
        own = Own(plan.round, plan.base_hash, np.array(params, dtype=np.float32, copy=True))
        head = json.dumps({"round": own.round, "base": own.base_hash}).encode()
        atomic_write(self.path, head + b"\n" + np.ascontiguousarray(own.params, dtype="<f4").tobytes())
        self._own = own

    def update(self, round_: int, base: np.ndarray, trained: np.ndarray) -> tuple[np.ndarray, Span]:
        """The update this member signs for ``round_``: "trained − base" on the fragment the
        round syncs, and that fragment."""
        span = round_span(base.size, self.fragments, round_)
        return (trained[span.start:span.stop] - base[span.start:span.stop]).astype(np.float32), span
