"""What a ledger holds in memory of each committed round, once verified.

A parsed result is big: one signed update header, one contributor row and one plan entry per
member. At a thousand members that is a few megabytes a round, on every node, for every round
of the job: memory grew as rounds times members. The signed frame is on disk (``ledgerfile``),
so memory holds only what is read often:

- ``kept``: a verified round without its evidence (the signed update and partial headers, the
  signed header bytes and the frame). What the next rounds are checked against stays: the
  digest, the model hash, the plan, the contributors (``evidence.verify_round`` reads nothing
  else of its history).
- ``slim``: a round older than the last ``WHOLE_ROUNDS``, which no check of a new round reads
  but by its digest, coordinator and weight. It drops its plan too, and its contributor rows
  become ``FrameRows``: their count (the round's fork-choice weight) is held, the rows are read
  back from the frame when an export or the API lists them; its plan likewise
  (``Result.reread``), parsed each time and not kept. ``Ledger.history`` gives a prefix of the
  chain with its last rounds whole again, for the checks that start in the past (a competing
  result, a catch-up from a fork), so that they do not parse a frame per look.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from gpuflex.node.core.evidence import QUORUM_ROUNDS
from gpuflex.node.core.messages import Result, result_of
from mesh.codec import Envelope

#: The rounds at the head of a ledger held whole: the plan of the last (who is eligible to
#: coordinate), the contributors of the last ``QUORUM_ROUNDS`` (quorum, sample cap, a masked
#: round's group draw), and one more so that a result competing for the head round is checked
#: against whole history.
WHOLE_ROUNDS = QUORUM_ROUNDS + 1

#: What a kept result no longer holds once verified: the signed updates and partials it carries.
EVIDENCE_FIELDS = ("updates", "partials")
#: What a slim result drops besides: read back from its frame when asked for.
SLIM_FIELDS = (*EVIDENCE_FIELDS, "contributors", "plan")


class FrameRows(Sequence[dict[str, Any]]):
    """An old round's contributor rows: their count held, the rows read from the round's signed
    frame (on disk) each time they are listed, and not kept."""

    __slots__ = ("_count", "_read")

    def __init__(self, read: Callable[[], bytes], count: int) -> None:
        self._read, self._count = read, count

    def __len__(self) -> int:
        return self._count

    def rows(self) -> list[dict[str, Any]]:
        """The rows, as the frame signed them (a file that changed under us raises WireError)."""
        return list(result_of(self._read()).contributors)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self.rows()[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(other) == self._count and list(other) == self.rows()

    __hash__ = None  # type: ignore[assignment]


class _Frame:
    """Reads one round's frame from a ledger's frames (a view of its file)."""

    __slots__ = ("_frames", "_index")

    def __init__(self, frames: Sequence[bytes], index: int) -> None:
        self._frames, self._index = frames, index

    def __call__(self) -> bytes:
        return self._frames[self._index]


def _stripped(env: Envelope, drop: tuple[str, ...]) -> Envelope:
    """``env`` without ``drop`` in its body, its signed header and its frame; its hashes kept."""
    digest, msg_id = env.digest, env.msg_id  # hashed while the signed bytes are there
    out = dataclasses.replace(env, signed=b"", raw=b"", body={k: v for k, v in env.body.items() if k not in drop})
    out.__dict__.update(digest=digest, msg_id=msg_id)  # cached_property's own slots
    return out


def kept(res: Result) -> Result:
    """``res`` as a ledger keeps it once its evidence verified: without the signed update and
    partial headers it carries, its parsed copy of the signed header bytes and its frame. Those
    are most of a parsed result (one signed update header per contributor: a megabyte a round
    at a thousand members, held three times over as the frame, the signed header and the
    parsed body); the frame stays on disk, for sync and for an audit."""
    if not res.updates and not res.partials and not res.env.signed and not res.env.raw:
        return res
    digest, plan = res.digest, res.plan  # hashed and parsed while the envelope is whole
    out = dataclasses.replace(res, updates=[], partials=[], env=_stripped(res.env, EVIDENCE_FIELDS))
    out.__dict__.update(digest=digest, parsed_plan=plan)
    return out


def is_slim(res: Result) -> bool:
    """Whether ``res`` is a ``slim`` round (its plan and rows are on disk only)."""
    return isinstance(res.contributors, FrameRows)


def slim(res: Result, frames: Sequence[bytes], index: int) -> Result:
    """``res``, round ``index + 1`` of the ledger whose frames are ``frames``, as an old round is
    held: its scalars (digest, hashes, coordinator, metrics, time), the count of its
    contributors, and where its frame is; without its plan or its rows."""
    read = _Frame(frames, index)
    out = dataclasses.replace(res, updates=[], partials=[], plan_frame=b"", env=_stripped(res.env, SLIM_FIELDS),
                              contributors=FrameRows(read, len(res.contributors)), reread=read)
    out.__dict__.update(digest=res.digest)
    return out


def whole(frame: bytes) -> Result:
    """A slim round made whole again from its frame, as ``kept`` holds it."""
    return kept(result_of(frame))
