"""The round ledger: a hash chain of signed Results, kept on every node.

Each result names the digest of the one before it, so the file can be audited offline and a
removed, reordered or edited round breaks the chain. The file is append-only: a header, then
each committed round's signed frame, written and fsynced before the round counts. A round
costs its own bytes on disk, not a rewrite of every round before it (at a thousand members a
round's frame is a megabyte, and a whole-file rewrite each round grew as the square of the
rounds). A torn or corrupt tail is found on load (the chain stops verifying there): the
verified rounds before it stand, the tail is cut off, and the node fetches the rest from peers.
A write that fails (a full disk) is cut off again and changes nothing in memory, so the node
never acts on a round it could not record; it catches up from peers once writes succeed.

In memory a ledger holds its last rounds parsed without their evidence (``kept``), the older
ones by their digest, hashes, coordinator, metrics and weight only (``slim``), and reads the
frames back from the file when a peer, an export or the API asks for them (``LedgerFrames``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

from gpuflex.node.core.evidence import ChainRules, EvidenceError, verify_round
from gpuflex.node.core.forkchoice import chain_weight
from gpuflex.node.core.kept import WHOLE_ROUNDS, is_slim, kept, slim, whole
from gpuflex.node.core.ledgerfile import (
    FORMAT,
    FileScan,
    LedgerError,
    LedgerFrames,
    Span,
    append_frames,
    cut,
    pack,
)
from gpuflex.node.core.messages import Result, result_of
from gpuflex.node.core.workfields import WireValue, contributor_work
from mesh.codec import WireError
from mesh.fsutil import StateWriteError, atomic_write

log = logging.getLogger("gpuflex.ledger")
GENESIS = ""
#: Presence and sync pages name a ledger's head by this many hex characters of its digest.
HEAD_CHARS = 16


@dataclass(frozen=True)
class LedgerClaim:
    """What a peer says of its ledger of one job (its presence, a sync page), typed but
    unverified: a reason to fetch that ledger, never a fact (``Ledger.may_win``). A value of
    the wrong type is None: ``height`` none says nothing, ``weight`` none is judged by height."""

    height: int | None
    weight: int | None = None
    head: str | None = None  # the head digest's first HEAD_CHARS characters

    @classmethod
    def from_wire(cls, height: WireValue, weight: WireValue = None, head: WireValue = None) -> LedgerClaim:
        return cls(height if _count(height) else None, weight if _count(weight) else None,
                   head if isinstance(head, str) and len(head) == HEAD_CHARS else None)


def verify_chain(frames: Sequence[bytes], job: str | None = None, rules: ChainRules | None = None) -> list[Result]:
    """Check every signature, hash link and round's evidence (``evidence.verify_round``);
    returns the parsed results. Without ``rules`` (an offline audit of a file alone) the
    rules are the job id's: min_nodes 1, round 1's coordinator unchecked."""
    results: list[Result] = []
    for i, frame in enumerate(frames, start=1):
        try:
            res = result_of(frame)
        except WireError as exc:
            raise LedgerError(f"round {i}: {exc}") from None
        if rules is None:
            rules = ChainRules(job=res.job if job is None else job)
        try:
            verify_round(res, results, rules)
        except EvidenceError as exc:
            raise LedgerError(str(exc)) from None
        results.append(res)
    return results


def verify_tail(frames: Sequence[bytes], start: int, ledger: Ledger) -> list[Result]:
    """Verify ``frames[start:]`` as the rounds after our first ``start`` (already verified)."""
    history = ledger.history(start)
    for i, frame in enumerate(frames[start:], start=start + 1):
        try:
            res = result_of(frame)
            verify_round(res, history, ledger.rules)
        except WireError as exc:
            raise LedgerError(f"round {i}: {exc}") from None
        except EvidenceError as exc:
            raise LedgerError(str(exc)) from None
        history.append(res)
    return history[start:]


class ChainCheck:
    """Checks a peer's ledger of a job frame by frame as it arrives (catch-up sync), so that a
    page that does not verify stops the fetch at once instead of being held with the rest.

    Frames equal to this node's own ledger at the same round are verified already: ``extend``
    returns this node's copy (the received bytes can be freed) and counts nothing as held.
    Every other frame must extend the chain so far with its evidence complete
    (``evidence.verify_round``); ``held`` counts the bytes of those, which the caller bounds."""

    def __init__(self, ledger: Ledger, start: int = 0) -> None:
        self.ledger = ledger
        # A catch-up that resumes after this node's first ``start`` rounds takes those as read.
        self.results: list[Result] = ledger.history(start)
        self.held = 0  # bytes of frames kept that this node did not already hold
        self._same = True  # every frame so far equals ours

    def __len__(self) -> int:
        return len(self.results)

    def links(self, frame: bytes) -> bool:
        """Whether ``frame`` names the last round checked so far as the one before it. A peer's
        ledger that does not extend the rounds a catch-up resumed after forked earlier: no
        fault of the peer's, the catch-up starts again from round 1. A frame that does not
        even open says yes here, so that ``extend`` rejects it and the peer pays."""
        try:
            res = result_of(frame)
        except WireError:
            return True
        return res.prev_result == (self.results[-1].digest if self.results else GENESIS)

    def extend(self, frame: bytes) -> bytes:
        """The frame to keep for the next round (ours where equal); raises LedgerError."""
        i = len(self.results)
        ours = self.ledger.frames
        if self._same and i < len(ours) and frame == ours[i]:
            self.results.append(self.ledger.results[i])
            return ours[i]
        if self._same:  # they differ from here: check against whole history
            self._same, self.results = False, self.ledger.history(i)
        try:
            res = result_of(frame)
            verify_round(res, self.results, self.ledger.rules)
        except WireError as exc:
            raise LedgerError(f"round {i + 1}: {exc}") from None
        except EvidenceError as exc:
            raise LedgerError(str(exc)) from None
        self.results.append(res)
        self.held += len(frame)
        return frame


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


@dataclass
class _Loaded:
    """What one ledger file holds, verified from its first round up to its first bad one."""

    file: BinaryIO
    version: int
    results: list[Result]
    spans: list[Span]  # each verified frame's place in the file (format 2)
    frames: list[bytes]  # the verified frames themselves (format 1, to be rewritten)
    end: int  # where the verified rounds end in the file (format 2)
    problem: str | None  # why the rest of the file, if any, was not taken


def _verified(f: BinaryIO, job: str, rules: ChainRules) -> _Loaded:
    """Verify a ledger file round by round, keeping the verified prefix: a torn last write or
    a corrupt frame costs the rounds from there on, which the node fetches again from peers,
    never the rounds before it."""
    scan = FileScan(f, job)
    got = _Loaded(f, scan.version, [], [], [], 0, None)
    for span, frame in scan:
        i = len(got.results) + 1
        if not isinstance(frame, bytes):
            got.problem = f"round {i}: not a frame"
            break
        try:
            res = result_of(frame)
            verify_round(res, got.results, rules)
        except WireError as exc:
            got.problem = f"round {i}: {exc}"
            break
        except EvidenceError as exc:
            got.problem = str(exc)
            break
        got.results.append(kept(res))
        if span is None:
            got.frames.append(frame)
        else:
            got.spans.append(span)
            old = len(got.results) - 1 - WHOLE_ROUNDS  # slim as it goes: the file may be long
            if old >= 0:
                got.results[old] = slim(got.results[old], LedgerFrames(f, got.spans, old + 1), old)
    got.end, got.problem = scan.end, got.problem or scan.problem
    return got


class Ledger:
    """One job's verified chain: the parsed results in memory (``kept``: what later rounds
    check against), the signed frames in the file (``frames`` reads them back)."""

    def __init__(self, path: Path, job: str, rules: ChainRules | None = None) -> None:
        self.path = path
        self.job = job
        self.rules = rules or ChainRules(job=job)
        self.results: list[Result] = []
        self._source: BinaryIO | bytes = b""  # what ``frames`` reads: the open file, or bytes
        self._spans: list[Span] = []  # each frame's offset and length in the source
        # Where the verified rounds end in the file: the next round is appended there. 0: the
        # file is not ours to append to (none yet, an older format, a tail that could not be
        # cut), and the next write rewrites it whole.
        self._end = 0

    @property
    def frames(self) -> LedgerFrames:
        """The signed frame of every round, read from the file on access."""
        return LedgerFrames(self._source, self._spans, len(self._spans))

    @property
    def backup(self) -> Path:
        """Where an older node kept the previous copy of a ledger it rewrote whole each round;
        read as a fallback, never written."""
        return self.path.with_name(self.path.name + ".prev")

    @property
    def head(self) -> str:
        return self.results[-1].digest if self.results else GENESIS

    def __len__(self) -> int:
        return len(self.results)

    @property
    def weight(self) -> int:
        """This ledger's fork-choice weight (``chain_weight``)."""
        return chain_weight(self.results)

    def may_win(self, claim: LedgerClaim) -> bool:
        """Whether a peer's ledger of this job, as the peer describes it (presence, a sync
        page: unchecked values from the wire), could win fork choice over this one: heavier
        (even if shorter), as heavy and longer, or the same on another head (two halves of a
        healed partition, which otherwise never learn of each other's rounds). A peer that does
        not say its weight is judged by height. Only a reason to fetch that ledger: it is
        checked round by round, and fork choice compares what verifies, before anything changes."""
        height, weight, head = claim.height, claim.weight, claim.head
        if height is None:
            return False
        ours = (self.weight, len(self))
        if weight is not None:
            if (weight, height) != ours:
                return (weight, height) > ours
        elif height != len(self):
            return height > len(self)
        return height > 0 and head is not None and head != self.head[:HEAD_CHARS]

    def load(self) -> list[str]:
        """Load the verified rounds from disk; returns the problems reported. A file that
        verifies only in part keeps its verified rounds and loses the rest (cut off the file,
        so that the next round follows the last good one); an older node's previous copy is
        taken where it verifies more rounds. A file in the older format is rewritten in this
        one."""
        problems: list[str] = []
        best: tuple[Path, _Loaded] | None = None
        for candidate in (self.path, self.backup):
            try:
                f: BinaryIO = candidate.open("rb")
            except FileNotFoundError:
                continue
            except OSError as exc:
                problems.append(f"{candidate.name}: cannot be opened ({exc.strerror or exc})")
                continue
            got = _verified(f, self.job, self.rules)
            if got.problem:
                problems.append(f"{candidate.name}: {got.problem}")
                log.error("ledger file %s is corrupt: %s", candidate, got.problem)
            if best is None or len(got.results) > len(best[1].results):
                if best is not None:
                    best[1].file.close()
                best = (candidate, got)
            else:
                f.close()
            if not got.problem:
                break
        if best is None or not best[1].results:
            if best is not None:
                best[1].file.close()
            return problems
        candidate, got = best
        if candidate == self.path and got.version == FORMAT:
            self._source, self._spans = got.file, got.spans
            self._end = cut(self.path, got.end) if got.problem else got.end
            self.results = got.results  # slimmed as verified, against this very file
        else:
            frames = got.frames or LedgerFrames(got.file, got.spans, len(got.spans))[:]
            got.file.close()
            try:
                self._rewrite(frames)
            except StateWriteError as exc:  # served from memory until a write succeeds
                problems.append(f"{self.path.name}: could not be rewritten ({exc})")
                data, self._spans = pack(self.job, frames)
                self._source, self._end = data, 0
            self._settle(got.results)  # what was slimmed read the file just closed
        return problems

    def history(self, n: int) -> list[Result]:
        """The first ``n`` rounds, the last ``WHOLE_ROUNDS`` of them whole: what a check of a
        round ``n + 1`` reads (``evidence.verify_round``), for a round that is not the next."""
        out = list(self.results[:n])
        frames = self.frames
        for i in range(max(0, len(out) - WHOLE_ROUNDS), len(out)):
            if is_slim(out[i]):
                out[i] = whole(frames[i])
        return out

    def whole_results(self) -> Iterator[Result]:
        """Every round with its plan and contributor rows, read back from the file for the
        rounds held slim (an export, the API's ledger): one frame at a time."""
        frames = self.frames
        return (whole(frames[i]) if is_slim(r) else r for i, r in enumerate(self.results))

    def _settle(self, results: list[Result]) -> None:
        """Hold ``results`` as this ledger's rounds after the file was written whole: all but
        the last ``WHOLE_ROUNDS`` slim, reading their rows from the file as it is now."""
        frames = self.frames
        old = len(results) - WHOLE_ROUNDS
        self.results = [slim(r, frames, i) if i < old else whole(frames[i]) if is_slim(r) else r
                        for i, r in enumerate(results)]

    def check_next(self, res: Result) -> None:
        """Raise LedgerError unless ``res`` extends this ledger with its evidence complete."""
        if res.round != len(self.results) + 1 or res.prev_result != self.head:
            raise LedgerError(f"round {res.round} does not extend the ledger at round {len(self.results)}")
        try:
            verify_round(res, self.results, self.rules)
        except EvidenceError as exc:
            raise LedgerError(str(exc)) from None

    def append(self, frame: bytes, res: Result, checked: bool = False) -> None:
        """Add the next round; ``checked``: its evidence was just verified (``check_next``).
        On StateWriteError nothing changed, in memory or on disk."""
        if not checked:
            self.check_next(res)
        elif res.round != len(self.results) + 1 or res.prev_result != self.head:
            raise LedgerError(f"round {res.round} does not extend the ledger at round {len(self.results)}")
        self._write_tail([frame])
        results = [*self.results, kept(res)]
        leaving = len(results) - 1 - WHOLE_ROUNDS  # the round that leaves the whole window
        if leaving >= 0:  # the rounds before it are slim already, and appends move no frame
            results[leaving] = slim(results[leaving], self.frames, leaving)
        self.results = results

    def replace(self, frames: Sequence[bytes], results: list[Result] | None = None) -> None:
        """Adopt a chain received from a peer; ``results``: the frames, already verified. A
        chain that extends ours (a catch-up on the same branch) is appended; another branch
        rewrites the file whole. On StateWriteError nothing changed."""
        results = verify_chain(list(frames), self.job, self.rules) if results is None else results
        n = len(self.results)
        # Ours is a prefix of theirs where the digests agree (a digest covers the signed bytes):
        # judged in memory, not by reading our frames back from the file.
        extends = len(results) >= n and all(a.digest == b.digest for a, b in zip(self.results, results, strict=False))
        if self._end and extends:
            self._write_tail(list(frames[n:]))
        else:
            self._rewrite(frames)
        self._settle([kept(r) for r in results])

    def _write_tail(self, frames: list[bytes]) -> None:
        """Append ``frames`` to the file (``ledgerfile.append_frames``)."""
        if not self._end:
            self._rewrite([*self.frames, *frames])
            return
        spans = append_frames(self.path, self._end, frames)
        self._spans = [*self._spans, *spans]
        self._end = spans[-1][0] + spans[-1][1] if spans else self._end  # the last frame's end

    def _rewrite(self, frames: Sequence[bytes]) -> None:
        """Replace the file whole (atomically) with ``frames``."""
        data, spans = pack(self.job, frames)
        atomic_write(self.path, data)
        try:
            source = self.path.open("rb")
        except OSError as exc:
            raise StateWriteError(exc.errno, f"could not read back {self.path}: {exc.strerror or exc}") from exc
        self._source, self._spans, self._end = source, spans, len(data)
        with contextlib.suppress(OSError):
            self.backup.unlink()  # an older node's copy: what it held is in the new file


def _count(value: WireValue) -> TypeGuard[int]:
    """A non-negative int from the wire (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
