"""The round ledger: a hash chain of signed Results, kept on every node.

Each result names the digest of the one before it, so the file can be audited offline and a
removed, reordered or edited round breaks the chain. The file is rewritten atomically after
each commit, and the previous good copy is kept beside it: a torn or corrupt file is detected
on load (the chain no longer verifies) and the node falls back to that copy. A write that fails
(a full disk) changes nothing, in memory or on disk, so the node never acts on a round it could
not record; it catches up from peers once writes succeed again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import msgpack

from gpuflex.errors import GpuflexError
from gpuflex.node.core.evidence import ChainRules, EvidenceError, verify_round
from gpuflex.node.core.messages import RESULT, Result, parse_result
from gpuflex.node.core.workfields import WireValue, contributor_work
from mesh.codec import WireError, open_envelope
from mesh.fsutil import atomic_write

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


class LedgerError(GpuflexError, ValueError):
    """The ledger does not verify; the message names the round and the reason."""


def verify_chain(frames: list[bytes], job: str | None = None, rules: ChainRules | None = None) -> list[Result]:
    """Check every signature, hash link and round's evidence (``evidence.verify_round``);
    returns the parsed results. Without ``rules`` (an offline audit of a file alone) the
    rules are the job id's: min_nodes 1, round 1's coordinator unchecked."""
    results: list[Result] = []
    for i, frame in enumerate(frames, start=1):
        try:
            res = parse_result(open_envelope(frame, expect_kind=RESULT))
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


def verify_tail(frames: list[bytes], start: int, ledger: Ledger) -> list[Result]:
    """Verify ``frames[start:]`` as the rounds after our first ``start`` (already verified)."""
    history = list(ledger.results[:start])
    for i, frame in enumerate(frames[start:], start=start + 1):
        try:
            res = parse_result(open_envelope(frame, expect_kind=RESULT))
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
        self.results: list[Result] = list(ledger.results[:start])
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
            res = parse_result(open_envelope(frame, expect_kind=RESULT))
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
        self._same = False
        try:
            res = parse_result(open_envelope(frame, expect_kind=RESULT))
            verify_round(res, self.results, self.ledger.rules)
        except WireError as exc:
            raise LedgerError(f"round {i + 1}: {exc}") from None
        except EvidenceError as exc:
            raise LedgerError(str(exc)) from None
        self.results.append(res)
        self.held += len(frame)
        return frame


#: What a kept result no longer holds once verified: the signed updates and partials it carries.
EVIDENCE_FIELDS = ("updates", "partials")


def kept(res: Result) -> Result:
    """``res`` as a ledger keeps it once its evidence verified: without the signed update and
    partial headers it carries, and without its parsed copy of the signed header bytes. Those
    are half to two thirds of a parsed result (one signed update header per contributor: a
    megabyte a round at a thousand members, held three times over as the frame, the signed
    header and the parsed body); the ledger's frames still hold every byte, for the file, for
    sync and for an audit. What later rounds check against stays: the digest, the model hash,
    the plan, the contributors (``evidence.verify_round`` reads nothing else of its history)."""
    if not res.updates and not res.partials and not res.env.signed:
        return res
    digest, plan = res.digest, res.plan  # hashed and parsed while the envelope is whole
    body = res.env.body
    env = dataclasses.replace(res.env, signed=b"", body={k: v for k, v in body.items() if k not in EVIDENCE_FIELDS})
    env.__dict__.update(digest=digest, msg_id=res.env.msg_id)  # cached_property's own slots
    out = dataclasses.replace(res, updates=[], partials=[], env=env)
    out.__dict__.update(digest=digest, plan=plan)
    return out


def result_key(res: Result) -> tuple[int, str]:
    """The last tie-break of fork choice: of two results for the same round, the earlier
    attempt wins, then the smaller digest. Neither can be climbed: each attempt names its own
    coordinator, and a digest covers exactly the signed bytes."""
    return (res.attempt, res.digest)


def round_weight(res: Result) -> int:
    """What one verified round weighs in fork choice: its counted contributions. A round that
    passed ``evidence.verify_round`` lists exactly its verified signed updates, one per
    distinct member of its plan, so the length of its contributor list is that count."""
    return len(res.contributors)


def chain_weight(chain: Sequence[Result]) -> int:
    """A verified chain's weight: the verified contributions summed over its rounds."""
    return sum(round_weight(r) for r in chain)


def prefer_chain(ours: Sequence[Result], theirs: Sequence[Result]) -> bool:
    """Whether a verified chain ``theirs`` should replace ``ours``.

    1. The heavier chain wins: more verified contributions summed over its rounds. Length
       alone would let a party holding ``min_nodes`` keys of a committed plan take an attempt
       it owns, commit rounds that count only its own updates, grow that branch privately
       faster than the mesh trains, and win. By weight, its branch must count more signed
       updates since the fork than the honest contributors did.
    2. At equal weight, the longer chain wins.
    3. Then the chain whose result wins where they first differ (``result_key``).

    Weight and length are properties of one chain and rule 3 is a lexicographic order, so this
    is one strict total order on verified chains: every node settles on the same ledger.

    A node behind on the same branch holds a prefix, lighter by every round it lacks (each
    counts at least ``min_nodes`` >= 1 contributions): it never pulls the mesh back. A root
    that commits a round and dies before its result goes out comes back with a branch nobody
    else holds; by then the mesh has retried that round and gone on. Judged at the fork alone,
    its earlier attempt would win, and, as no one can fetch its model while it restarts, the
    mesh would stall or stay split. By weight, the mesh's chain wins as soon as its rounds
    since the fork count more contributions than the root's one round (usually one round
    later); until then the root's branch is heavier and every node adopts it once the root
    serves its model. Either way all settle on one ledger."""
    weight_ours, weight_theirs = chain_weight(ours), chain_weight(theirs)
    if weight_theirs != weight_ours:
        return weight_theirs > weight_ours
    if len(theirs) != len(ours):
        return len(theirs) > len(ours)
    for a, b in zip(ours, theirs, strict=False):
        if a.digest != b.digest:
            return result_key(b) < result_key(a)
    return False


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
    def __init__(self, path: Path, job: str, rules: ChainRules | None = None) -> None:
        self.path = path
        self.job = job
        self.rules = rules or ChainRules(job=job)
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
        """Load from disk, falling back to the previous copy; returns problems reported."""
        problems: list[str] = []
        for candidate in (self.path, self.backup):
            if not candidate.exists():
                continue
            try:
                frames = read_ledger_file(candidate)
                self.results = [kept(r) for r in verify_chain(frames, self.job, self.rules)]
                self.frames = frames
                return problems
            except LedgerError as exc:
                problems.append(f"{candidate.name}: {exc}")
                log.error("ledger file %s is corrupt: %s", candidate, exc)
        return problems

    def check_next(self, res: Result) -> None:
        """Raise LedgerError unless ``res`` extends this ledger with its evidence complete."""
        if res.round != len(self.results) + 1 or res.prev_result != self.head:
            raise LedgerError(f"round {res.round} does not extend the ledger at round {len(self.results)}")
        try:
            verify_round(res, self.results, self.rules)
        except EvidenceError as exc:
            raise LedgerError(str(exc)) from None

    def append(self, frame: bytes, res: Result, checked: bool = False) -> None:
        """Add the next round; ``checked``: its evidence was just verified (``check_next``)."""
        if not checked:
            self.check_next(res)
        elif res.round != len(self.results) + 1 or res.prev_result != self.head:
            raise LedgerError(f"round {res.round} does not extend the ledger at round {len(self.results)}")
        self._adopt([*self.frames, frame], [*self.results, res])

    def _adopt(self, frames: list[bytes], results: list[Result]) -> None:
        self.save(frames)  # on StateWriteError the file on disk still holds the previous rounds
        self.frames, self.results = frames, [kept(r) for r in results]

    def save(self, frames: list[bytes] | None = None) -> None:
        frames = self.frames if frames is None else frames
        data = msgpack.packb({"v": 1, "job": self.job, "frames": frames}, use_bin_type=True)
        if self.path.exists():
            try:
                atomic_write(self.backup, self.path.read_bytes())
            except OSError as exc:
                log.warning("could not keep the previous ledger copy: %s", exc)
        atomic_write(self.path, data)

    def replace(self, frames: list[bytes], results: list[Result] | None = None) -> None:
        """Adopt a chain received from a peer; ``results``: the frames, already verified."""
        self._adopt(list(frames), verify_chain(frames, self.job, self.rules) if results is None else results)


def _count(value: WireValue) -> TypeGuard[int]:
    """A non-negative int from the wire (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_ledger_file(path: Path) -> list[bytes]:
    try:
        body = msgpack.unpackb(path.read_bytes(), raw=False)
        frames = body["frames"]
        if not all(isinstance(f, bytes) for f in frames):
            raise TypeError("frames")
    except Exception as exc:  # a torn or foreign file may fail msgpack in any way: it is unreadable
        raise LedgerError(f"round ?: file cannot be read ({exc.__class__.__name__})") from None
    return list(frames)
