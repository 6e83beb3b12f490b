"""The round protocol's signed messages and their schemas.

Each message is a ``mesh`` envelope; this module gives each kind a size limit, a builder and
a parser that checks every field's type, so the round logic only ever sees well-formed
values and any malformed body becomes a ``WireError`` (logged, dropped, penalised).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from gpuflex.node.core.fields import read_count, read_field, read_finite, read_frames, read_strs
from gpuflex.node.core.workfields import claimed_steps, plan_budget, planned_steps, update_device
from mesh.blobhash import valid_hash
from mesh.codec import Envelope, WireError, WireReason, open_envelope, register_kind, seal
from mesh.compat import StrEnum
from mesh.identity import Identity


class MessageKind(StrEnum):
    """Every kind of signed message the round protocol sends (the envelope's ``kind``)."""

    JOB = "job"
    PRESENCE = "presence"
    PLAN = "plan"
    UPDATE = "update"
    PARTIAL = "partial"
    RESULT = "result"
    ABORT = "abort"
    SYNC = "sync_req"
    SECAGG_RECOVER = "secagg_recover"
    SECAGG_SHARES = "secagg_shares"
    TAKEN = "taken"
    EMPTY = "empty"


JOB, PRESENCE, PLAN, UPDATE, PARTIAL, RESULT, ABORT, SYNC = list(MessageKind)[:8]  # in the order above
register_kind(JOB, 256 * 1024)
register_kind(PRESENCE, 8 * 1024)
register_kind(PLAN, 1024 * 1024)
register_kind(UPDATE, 64 * 1024)
register_kind(PARTIAL, 8 * 1024 * 1024)
register_kind(RESULT, 12 * 1024 * 1024)
register_kind(ABORT, 8 * 1024)
register_kind(SYNC, 8 * 1024)
# Secure-aggregation dropout recovery: a leader's request to one survivor, and its answer.
# One entry per (surviving owner, dropped partner) pair is about 220 bytes: 2 MiB covers a
# group of about 190 members with half of them gone.
SECAGG_RECOVER, SECAGG_SHARES = MessageKind.SECAGG_RECOVER, MessageKind.SECAGG_SHARES
register_kind(SECAGG_RECOVER, 2 * 1024 * 1024)
register_kind(SECAGG_SHARES, 2 * 1024 * 1024)
# An ancestor's word that it folded work that went past a node (``Taken``): one peer id per
# contribution, about 55 bytes each, so a whole 4,000-member subtree fits.
TAKEN = MessageKind.TAKEN
register_kind(TAKEN, 256 * 1024)
# A leader's word to its parent that it has nothing to send (``Empty``): a few ids and counts.
EMPTY = MessageKind.EMPTY
register_kind(EMPTY, 4 * 1024)
#: A Shamir share is one element of GF(2^521 - 1): 66 bytes, big-endian.
SHARE_BYTES = 66
#: Rounds and attempts are counts a signer writes: bounded, so no one wins anything with a
#: huge one (fork choice prefers the earlier attempt; the ranking names one coordinator per
#: attempt). 2^31 attempts at one per plan timeout is decades.
MAX_ROUND = MAX_ATTEMPT = 2**31 - 1
#: A sample count above this is refused outright (floats stay exact below 2^53); below it the
#: plan's sample cap decides how much a claim weighs (``capped``).
MAX_SAMPLES = 2**53


@dataclass(frozen=True)
class Plan:
    job: str
    round: int
    attempt: int
    coordinator: str
    base_hash: str
    prev_result: str
    members: tuple[str, ...]
    parent: dict[str, str | None]
    train_deadline: float
    reduce_slack_s: float
    env: Envelope
    sample_cap: int = 0  # the most one update's sample count weighs in this round (0: no cap)
    private: tuple[str, ...] = ()  # members the coordinator placed as leaves (behind NAT)
    budget_s: float = 0.0  # a time-budgeted round: seconds of local training per member
    steps: dict[str, int] = field(default_factory=dict)  # each member's planned local steps

    @property
    def issued(self) -> float:
        return self.env.ts

    @property
    def digest(self) -> str:
        """What every update for this plan signs (``Update.plan``)."""
        return self.env.digest


def created_at(env: Envelope) -> float:
    """When a JOB frame's publisher says it made the job (its signed ``created``): for
    ordering jobs and judging their age only; anything but a finite number counts as 0."""
    value = env.body.get("created") if isinstance(env.body, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return 0.0


def make_plan(identity: Identity, **body: Any) -> bytes:
    return seal(identity, PLAN, body)


def parse_plan(env: Envelope) -> Plan:
    b, what = env.body, "plan"
    members = read_strs(b, "members", what)
    parent = read_field(b, "parent", dict, what)
    if set(parent) != set(members) or not all(v is None or v in parent for v in parent.values()):
        raise WireError(WireReason.GARBLED, "plan tree does not match its members")
    private = read_strs(b, "private", what) if isinstance(b, dict) and "private" in b else ()
    plan = Plan(
        job=read_field(b, "job", str, what), round=read_count(b, "round", what, 1, MAX_ROUND),
        attempt=read_count(b, "attempt", what, 0, MAX_ATTEMPT),
        coordinator=read_field(b, "coordinator", str, what), base_hash=read_field(b, "base_hash", str, what),
        prev_result=read_field(b, "prev_result", str, what), members=members, parent=parent,
        train_deadline=read_finite(b, "train_deadline", what), reduce_slack_s=read_finite(b, "reduce_slack_s", what),
        env=env, sample_cap=read_count(b, "sample_cap", what, 0, MAX_SAMPLES) if "sample_cap" in b else 0,
        private=private, budget_s=plan_budget(b), steps=planned_steps(b, parent),
    )
    if plan.coordinator != env.sender or parent.get(plan.coordinator, "x") is not None:
        raise WireError(WireReason.GARBLED, "plan must be signed by its coordinator, the root of its tree")
    if len(set(members)) != len(members) or not set(private) <= set(members):
        raise WireError(WireReason.GARBLED, "plan lists a member twice, or a private peer that is no member")
    return plan


@dataclass(frozen=True)
class Update:
    job: str
    round: int
    peer: str
    base_hash: str
    samples: int
    delta_hash: str
    delta_size: int
    metrics: dict[str, Any]
    env: Envelope
    plan: str = ""  # the digest of the plan this update was made for: it counts in no other
    device: str = ""  # what it trained on, as the member says (for people; bounded)

    @property
    def claimed(self) -> int:
        """The sample count the member signed; ``samples`` is what it weighs (``capped``)."""
        claimed = self.env.body.get("samples") if isinstance(self.env.body, dict) else None
        return claimed if isinstance(claimed, int) else self.samples

    @property
    def steps(self) -> int:
        """Local optimizer steps the member says it took (0 when it does not say)."""
        return claimed_steps(self.metrics)


def parse_update(env: Envelope) -> Update:
    b, what = env.body, "update"
    up = Update(
        job=read_field(b, "job", str, what), round=read_count(b, "round", what, 1, MAX_ROUND),
        peer=read_field(b, "peer", str, what),
        base_hash=read_field(b, "base_hash", str, what), samples=read_count(b, "samples", what, 1, MAX_SAMPLES),
        delta_hash=read_field(b, "delta_hash", str, what), delta_size=read_count(b, "delta_size", what, 1, MAX_SAMPLES),
        metrics=read_field(b, "metrics", dict, what), env=env, plan=read_field(b, "plan", str, what),
        device=update_device(b),
    )
    if up.peer != env.sender:
        raise WireError(WireReason.GARBLED, "update must be signed by its own peer")
    return up


@dataclass(frozen=True)
class TrainedUpdate:
    """A member's own update as one value: the signed frame, what it says, and the payload its
    hash covers. Sealed once (``seal_update``); its owner never reopens the frame."""

    frame: bytes
    update: Update
    payload: bytes


def seal_update(identity: Identity, payload: bytes, **body: Any) -> TrainedUpdate:
    frame = seal(identity, UPDATE, body)
    return TrainedUpdate(frame, parse_update(open_envelope(frame, expect_kind=UPDATE)), payload)


def capped(up: Update, cap: int) -> Update:
    """``up`` weighing at most ``cap`` samples (0: no cap). A member's sample count is its own
    claim, so a claim of 10^12 would otherwise outweigh everyone; every weight (a leader's fold,
    a partial's total, the result's contributor list) is read from the capped update."""
    return replace(up, samples=min(up.samples, cap)) if 0 < cap < up.samples else up


@dataclass(frozen=True)
class Partial:
    job: str
    round: int
    attempt: int
    leader: str
    samples: int
    delta_hash: str
    updates: list[bytes]
    partials: list[bytes]
    env: Envelope
    secagg: tuple[dict[str, Any], ...] = ()


def parse_partial(env: Envelope) -> Partial:
    b, what = env.body, "partial"
    part = Partial(
        job=read_field(b, "job", str, what), round=read_count(b, "round", what, 1, MAX_ROUND),
        attempt=read_count(b, "attempt", what, 0, MAX_ATTEMPT),
        leader=read_field(b, "leader", str, what), samples=read_field(b, "samples", int, what),
        delta_hash=read_field(b, "delta_hash", str, what), updates=read_frames(b, "updates", what),
        partials=read_frames(b, "partials", what), env=env,
        secagg=parse_secagg_reports(b.get("secagg", []) if isinstance(b, dict) else [], what),
    )
    if part.leader != env.sender or part.samples <= 0:
        raise WireError(WireReason.GARBLED, "partial must be signed by its leader and cover samples")
    return part


@dataclass(frozen=True)
class Result:
    job: str
    round: int
    attempt: int
    coordinator: str
    prev_result: str
    base_hash: str
    model_hash: str
    plan_frame: bytes
    updates: list[bytes]
    partials: list[bytes]
    contributors: Sequence[dict[str, Any]]  # a ledger holds an old round's on disk (``kept.FrameRows``)
    absent: tuple[str, ...]
    metrics: dict[str, Any]
    strategy: str
    env: Envelope
    step_hash: str | None = None  # the encoded step members rebuild the model from, if any
    # A round a ledger holds slim (``kept.slim``) reads its signed frame back from the file with
    # this, for the plan and rows it no longer holds; None for every other result.
    reread: Callable[[], bytes] | None = field(default=None, compare=False, repr=False)

    @cached_property
    def digest(self) -> str:
        """Hashed once: a result carries every member's signed update header, and the ledger's
        head is read at every presence a node receives."""
        return self.env.digest

    @property
    def plan(self) -> Plan:
        """The signed plan this result commits, parsed and verified once and kept; a slim
        round's is parsed from its frame on disk each time, and not kept."""
        got: Plan | None = self.__dict__.get("parsed_plan")
        if got is None:
            if not self.plan_frame and self.reread is not None:
                return result_of(self.reread()).plan
            got = parse_plan(open_envelope(self.plan_frame, expect_kind=PLAN))
            self.__dict__["parsed_plan"] = got  # frozen: the one value it will ever have
        return got


def parse_result(env: Envelope) -> Result:
    b, what = env.body, "result"
    res = Result(
        job=read_field(b, "job", str, what), round=read_count(b, "round", what, 1, MAX_ROUND),
        attempt=read_count(b, "attempt", what, 0, MAX_ATTEMPT),
        coordinator=read_field(b, "coordinator", str, what), prev_result=read_field(b, "prev_result", str, what),
        base_hash=read_field(b, "base_hash", str, what), model_hash=read_field(b, "model_hash", str, what),
        plan_frame=read_field(b, "plan", bytes, what), updates=read_frames(b, "updates", what),
        partials=read_frames(b, "partials", what), contributors=read_field(b, "contributors", list, what),
        absent=read_strs(b, "absent", what), metrics=read_field(b, "metrics", dict, what),
        strategy=read_field(b, "strategy", str, what), env=env,
        step_hash=read_field(b, "step_hash", str, what) if "step_hash" in b else None,
    )
    if res.coordinator != env.sender:
        raise WireError(WireReason.GARBLED, "result must be signed by its coordinator")
    if res.step_hash is not None and not valid_hash(res.step_hash):
        raise WireError(WireReason.GARBLED, "result field 'step_hash' is not a blob hash")
    return res


def result_of(frame: bytes) -> Result:
    """The signed ``Result`` a frame holds (its signature checked); WireError if it is none."""
    return parse_result(open_envelope(frame, expect_kind=RESULT))


def walk_contributions(updates: list[bytes], partials: list[bytes], job: str, round_: int,
                       plan: Plan | None = None, depth: int = 0) -> list[Update]:
    """Every signed Update under a result or partial, each signature checked, each peer once.

    With ``plan``: every update must have been made for that very plan, by one of its members,
    and weighs at most the plan's sample cap; every partial must be its attempt's, from one of
    its members. (Only an offline audit, which may lack the plan's context, walks without.)"""
    if depth > 32:
        raise WireError(WireReason.GARBLED, "partial tree is too deep")
    found = []
    for frame in updates:
        up = parse_update(open_envelope(frame, expect_kind=UPDATE))
        if up.job != job or up.round != round_:
            raise WireError(WireReason.ROUND, f"update from {up.peer[-8:]} belongs to another round")
        if plan is not None:
            if up.plan != plan.digest or up.peer not in plan.parent:
                raise WireError(WireReason.ROUND,
                                f"update from {up.peer[-8:]} was not made for this plan by one of its members")
            up = capped(up, plan.sample_cap)
        found.append(up)
    for frame in partials:
        part = parse_partial(open_envelope(frame, expect_kind=PARTIAL))
        if plan is not None and (part.attempt != plan.attempt or part.leader not in plan.parent):
            raise WireError(WireReason.ROUND,
                            f"partial from {part.leader[-8:]} is not from this plan's attempt and members")
        found.extend(walk_contributions(part.updates, part.partials, job, round_, plan, depth + 1))
    if depth == 0 and len({u.peer for u in found}) != len(found):
        raise WireError(WireReason.ROUND, "a peer's update is counted twice")
    return found


# -- secure aggregation: group reports and dropout recovery --------------------------------

_REPORT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "leader": str, "attempt": int, "survivors": list, "dropped": list, "recovered": bool, "reason": str}


def parse_secagg_reports(value: Any, what: str) -> tuple[dict[str, Any], ...]:
    """Group reports (who masked, who dropped, whether the sum was recovered) as carried by
    partials, aborts and results; each is checked field by field, extras are dropped."""
    if not isinstance(value, list) or len(value) > 4096:
        raise WireError(WireReason.GARBLED, f"{what} field 'secagg' must be a list of group reports")
    out = []
    for item in value:
        if not isinstance(item, dict):
            raise WireError(WireReason.GARBLED, f"{what} has a secure-aggregation report that is not a map")
        report = {name: read_field(item, name, kind, f"{what} secure-aggregation report")
                  for name, kind in _REPORT_FIELDS.items()}
        for name in ("survivors", "dropped"):
            report[name] = list(read_strs(item, name, f"{what} secure-aggregation report"))
        out.append(report)
    return tuple(out)


@dataclass(frozen=True)
class RecoveryRequest:
    """A leader asks one survivor to decrypt the seed shares addressed to it."""

    job: str
    round: int
    attempt: int
    leader: str
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    shares: list[tuple[str, str, bytes]]  # (surviving owner, dropped partner, ciphertext)
    env: Envelope


def _triples(body: Any, what: str) -> list[tuple[str, str, bytes]]:
    items = read_field(body, "shares", list, what)
    if not all(isinstance(t, list) and len(t) == 3 and isinstance(t[0], str) and isinstance(t[1], str)
               and isinstance(t[2], bytes) for t in items):
        raise WireError(WireReason.GARBLED, f"{what} field 'shares' must hold [owner, dropped, bytes] triples")
    return [(t[0], t[1], t[2]) for t in items]


def parse_recovery_request(env: Envelope) -> RecoveryRequest:
    b, what = env.body, "recovery request"
    req = RecoveryRequest(
        job=read_field(b, "job", str, what), round=read_field(b, "round", int, what),
        attempt=read_field(b, "attempt", int, what),
        leader=read_field(b, "leader", str, what), survivors=read_strs(b, "survivors", what),
        dropped=read_strs(b, "dropped", what), shares=_triples(b, what), env=env,
    )
    if req.leader != env.sender:
        raise WireError(WireReason.GARBLED, "recovery request must be signed by its leader")
    return req


@dataclass(frozen=True)
class RecoveryAnswer:
    """A survivor's decrypted shares, bound to the request they answer by its digest."""

    job: str
    round: int
    attempt: int
    holder: str
    request: str
    shares: list[tuple[str, str, int]]  # (surviving owner, dropped partner, share value)
    env: Envelope


def parse_recovery_answer(env: Envelope) -> RecoveryAnswer:
    b, what = env.body, "recovery answer"
    triples = _triples(b, what)
    if any(len(y) != SHARE_BYTES for _, _, y in triples):
        raise WireError(WireReason.GARBLED, f"{what} has a share that is not {SHARE_BYTES} bytes")
    ans = RecoveryAnswer(
        job=read_field(b, "job", str, what), round=read_field(b, "round", int, what),
        attempt=read_field(b, "attempt", int, what),
        holder=read_field(b, "holder", str, what), request=read_field(b, "request", str, what),
        shares=[(o, d, int.from_bytes(y, "big")) for o, d, y in triples], env=env,
    )
    if ans.holder != env.sender:
        raise WireError(WireReason.GARBLED, "recovery answer must be signed by the survivor that holds the shares")
    return ans
