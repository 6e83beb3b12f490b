"""The round ledger: a hash chain of signed RoundResults, kept on every node.

Each result names the digest of the one before it, so the file can be audited offline and a
removed, reordered or edited round breaks the chain. The file is rewritten atomically after
each commit, and the previous good copy is kept beside it: a torn or corrupt file is detected
on load (the chain no longer verifies) and the node falls back to that copy. A write that fails
(a full disk) changes nothing, in memory or on disk, so the node never acts on a round it could
not record; it catches up from peers once writes succeed again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgpack

from gpuflex.errors import GpuflexError
from gpuflex.node.messages import (
    PLAN,
    RESULT,
    Result,
    contributor_work,
    parse_plan,
    parse_result,
    walk_contributions,
)
from mesh.codec import WireError, open_envelope
from mesh.fsutil import atomic_write

log = logging.getLogger("gpuflex.ledger")
GENESIS = ""


class LedgerError(GpuflexError, ValueError):
    """The ledger does not verify; the message names the round and the reason."""


def verify_chain(frames: list[bytes], job: str | None = None) -> list[Result]:
    """Check every signature and hash link; returns the parsed results."""
    results: list[Result] = []
    prev = GENESIS
    for i, frame in enumerate(frames, start=1):
        try:
            res = parse_result(open_envelope(frame, expect_kind=RESULT))
            plan = parse_plan(open_envelope(res.plan_frame, expect_kind=PLAN))
            contributions = walk_contributions(res.updates, res.partials, res.job, res.round)
        except WireError as exc:
            raise LedgerError(f"round {i}: {exc}") from None
        if job is not None and res.job != job:
            raise LedgerError(f"round {i}: belongs to job {res.job}, not {job}")
        if res.round != i:
            raise LedgerError(f"round {i}: entry says round {res.round} (a round is missing or repeated)")
        if res.prev_result != prev:
            raise LedgerError(f"round {i}: hash link to the previous result is broken")
        if plan.coordinator != res.coordinator or plan.round != res.round or plan.job != res.job:
            raise LedgerError(f"round {i}: the plan does not match the result")
        if plan.base_hash != res.base_hash:
            raise LedgerError(f"round {i}: base model differs from the plan's")
        listed = sorted((c.get("peer"), c.get("samples"), c.get("delta_hash")) for c in res.contributors)
        signed = sorted((u.peer, u.samples, u.delta_hash) for u in contributions)
        if listed != signed:
            raise LedgerError(f"round {i}: contributor list does not match the signed updates")
        claimed = {c["peer"]: c["steps"] for c in res.contributors if "steps" in c and isinstance(c.get("peer"), str)}
        if any(u.peer in claimed and claimed[u.peer] != u.steps for u in contributions):
            raise LedgerError(f"round {i}: a contributor's step count differs from its signed update's")
        if any(u.base_hash != res.base_hash for u in contributions):
            raise LedgerError(f"round {i}: an update was trained from another base model")
        results.append(res)
        prev = res.digest
    return results


def result_key(res: Result) -> tuple[int, str]:
    """Fork choice: of two results for the same round, the earlier attempt wins, then the
    smaller digest. Every node applies the same total order, so all settle on one ledger."""
    return (res.attempt, res.digest)


def prefer_chain(ours: list[Result], theirs: list[Result]) -> bool:
    """Whether a verified chain ``theirs`` should replace ``ours``."""
    for a, b in zip(ours, theirs, strict=False):
        if a.digest != b.digest:
            return result_key(b) < result_key(a)
    return len(theirs) > len(ours)


def result_row(res: Result) -> dict[str, Any]:
    """JSON view of one result for the API, the CLI and exports."""
    return {
        "round": res.round,
        "attempt": res.attempt,
        "coordinator": res.coordinator,
        # Each member's device, local steps, training seconds, throughput and compute share,
        # where the round recorded them (time-budgeted rounds and later).
        "contributors": [{"peer": c.get("peer"), "samples": c.get("samples"), **contributor_work(c)}
                         for c in res.contributors],
        "absent": list(res.absent),
        "metrics": res.metrics,
        "strategy": res.strategy,
        "base_hash": res.base_hash,
        "model_hash": res.model_hash,
        "prev_result_hash": res.prev_result,
        "result_hash": res.digest,
        "ts": res.env.ts,
    }


class Ledger:
    def __init__(self, path: Path, job: str) -> None:
        self.path = path
        self.job = job
        self.frames: list[bytes] = []
        self.results: list[Result] = []

    @property
    def backup(self) -> Path:
        return self.path.with_name(self.path.name + ".prev")

    @property
    def head(self) -> str:
        return self.results[-1].digest if self.results else GENESIS

    def __len__(self) -> int:
        return len(self.results)

    def load(self) -> list[str]:
        """Load from disk, falling back to the previous copy; returns problems reported."""
        problems: list[str] = []
        for candidate in (self.path, self.backup):
            if not candidate.exists():
                continue
            try:
                frames = read_ledger_file(candidate)
                self.results = verify_chain(frames, self.job)
                self.frames = frames
                return problems
            except LedgerError as exc:
                problems.append(f"{candidate.name}: {exc}")
                log.error("ledger file %s is corrupt: %s", candidate, exc)
        return problems

    def append(self, frame: bytes, res: Result) -> None:
        if res.round != len(self.results) + 1 or res.prev_result != self.head:
            raise LedgerError(f"round {res.round} does not extend the ledger at round {len(self.results)}")
        self._adopt([*self.frames, frame], [*self.results, res])

    def _adopt(self, frames: list[bytes], results: list[Result]) -> None:
        self.save(frames)  # on StateWriteError the file on disk still holds the previous rounds
        self.frames, self.results = frames, results

    def save(self, frames: list[bytes] | None = None) -> None:
        frames = self.frames if frames is None else frames
        data = msgpack.packb({"v": 1, "job": self.job, "frames": frames}, use_bin_type=True)
        if self.path.exists():
            try:
                atomic_write(self.backup, self.path.read_bytes())
            except OSError as exc:
                log.warning("could not keep the previous ledger copy: %s", exc)
        atomic_write(self.path, data)

    def replace(self, frames: list[bytes]) -> None:
        """Adopt a longer verified chain received from a peer."""
        self._adopt(list(frames), verify_chain(frames, self.job))


def read_ledger_file(path: Path) -> list[bytes]:
    try:
        body = msgpack.unpackb(path.read_bytes(), raw=False)
        frames = body["frames"]
        if not all(isinstance(f, bytes) for f in frames):
            raise TypeError("frames")
    except Exception as exc:  # a torn or foreign file may fail msgpack in any way: it is unreadable
        raise LedgerError(f"round ?: file cannot be read ({exc.__class__.__name__})") from None
    return list(frames)
