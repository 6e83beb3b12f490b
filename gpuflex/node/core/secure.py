"""Secure aggregation inside one group of the round tree: keys, the member side, the leader side.

Threat model: the leader is honest-but-curious (it follows the protocol, including reporting
dropouts truthfully, but would like to read individual updates) and does not collude with
members. Under it, the leader learns only the sum of its group's updates.

Who masks: the members whose update goes straight to a leader (its children that lead nobody).
The leader's own update is its own data, so it enters in clear; child leaders send partials,
which are already sums. Pairwise keys need no messages: both sides derive them from their
Ed25519 identities (the PeerID holds the public key), converted to X25519, salted with the job,
round, attempt and leader so a seed is never reused.

Dropouts: each member encrypts, for every third group member, one Shamir share of every
pairwise seed it holds, and ships them inside its own (hash-signed) payload. If member u never
delivers, the leader hands each survivor the shares addressed to it about u's seeds (a signed
``secagg_recover`` request); survivors decrypt and return them (a signed ``secagg_shares``
answer), and any ``threshold`` of them rebuild the seeds that remove the masks dangling from u.
A survivor answers for one split of the group into survivors and dropped members only, and
never about its own seeds. The roles move the messages (the leader's round trip is
``gpuflex.node.recovery``); the checks and the bookkeeping are here, with no I/O.

Known limit: there is no second, self mask (Bonawitz et al.'s "double masking"). A member
that is declared dropped but whose update still reaches the leader after the recovery could
be unmasked by that leader; the leader refuses such a late update (its collection is closed),
and under the threat model above it does not read what it refused.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import msgpack
import numpy as np
from nacl.bindings import crypto_scalarmult, crypto_sign_ed25519_pk_to_curve25519
from nacl.exceptions import CryptoError
from nacl.secret import SecretBox

from aggregation import secagg
from aggregation.sparse import SparseVector
from aggregation.tree import children
from aggregation.weighted import WeightedAccumulator
from gpuflex.node.core.messages import (
    SECAGG_RECOVER,
    SECAGG_SHARES,
    SHARE_BYTES,
    RecoveryRequest,
    parse_recovery_answer,
)
from gpuflex.node.core.workfields import WireValue
from mesh.codec import WireError, WireReason, open_envelope, seal
from mesh.identity import Identity, public_key_from_peer_id

MAGIC = b"GFSA"


@dataclass(frozen=True)
class GroupContext:
    """What every party of one group agrees on for one round attempt."""

    job: str
    round: int
    attempt: int
    leader: str
    group: tuple[str, ...]  # the masking members, sorted
    threshold: int
    clip_range: float

    def label(self) -> bytes:
        return f"{self.job}|{self.round}|{self.attempt}|{self.leader}".encode()

    def holders(self, owner: str, partner: str) -> list[str]:
        """Who gets a share of the seed between owner and partner: everyone else in the group."""
        return [m for m in self.group if m not in (owner, partner)]

    def x_of(self, holder: str) -> int:
        return self.group.index(holder) + 1


def mask_group(parent: Mapping[str, str | None], node: str) -> tuple[str, tuple[str, ...]]:
    """(leader, masking members) of the group ``node``'s own update is reduced in.

    A node that leads a group reduces its own update itself, so it masks nothing: the group
    it returns then is its own (its childless children), and the caller sees it is the leader.
    """
    leader = node if children(parent, node) or parent.get(node) is None else parent[node]
    assert leader is not None
    members = [c for c in children(parent, leader) if not children(parent, c)]
    return leader, tuple(sorted(members))


def pairwise_keys(identity: Identity, peer: str, ctx: GroupContext) -> tuple[bytes, bytes]:
    """(mask seed, SecretBox key) shared with ``peer``; both ends compute the same pair."""
    try:
        peer_x = crypto_sign_ed25519_pk_to_curve25519(public_key_from_peer_id(peer))
    except (ValueError, CryptoError) as exc:
        raise WireError(WireReason.GARBLED, f"cannot derive a key for {peer[-8:]}: {exc}") from None
    shared = crypto_scalarmult(identity.x25519_private_key(), peer_x)
    pair = "|".join(sorted((identity.peer_id, peer))).encode()
    material = ctx.label() + b"|" + pair
    seed = hashlib.blake2b(material, key=shared, digest_size=32, person=b"gpuflex-sa-mask").digest()
    box = hashlib.blake2b(material, key=shared, digest_size=32, person=b"gpuflex-sa-box").digest()
    return seed, box


@dataclass(frozen=True)
class MaskedUpdate:
    """A decoded secure-aggregation payload: ring vector plus encrypted shares.

    ``shares`` maps (partner, holder) to the ciphertext of the holder's share of the seed
    between the sender and partner.
    """

    ring: np.ndarray
    shares: dict[tuple[str, str], bytes]


#: What a leader folds for one update or partial: a plain delta (a SparseVector under codec =
#: "sparse", summed as it is) or, under secure aggregation, a masked one.
Folded: TypeAlias = "np.ndarray | SparseVector | MaskedUpdate"


class SecAggMember:
    """A masking member's side: quantise, mask, attach encrypted seed shares; answer recovery."""

    def __init__(self, identity: Identity, ctx: GroupContext) -> None:
        if identity.peer_id not in ctx.group:
            raise ValueError("this node does not mask in this group")
        self.me = identity.peer_id
        self.ctx = ctx
        self._keys = {p: pairwise_keys(identity, p, ctx) for p in ctx.group if p != self.me}
        self._split: tuple[frozenset[str], frozenset[str]] | None = None

    def encode(self, delta: np.ndarray, samples: int) -> bytes:
        q = secagg.quantize(delta, samples, self.ctx.clip_range)
        masked = secagg.apply_masks(q, self.me, {p: k[0] for p, k in self._keys.items()})
        shares: list[list[object]] = []
        for partner, (seed, _) in sorted(self._keys.items()):
            holders = self.ctx.holders(self.me, partner)
            if not holders:
                continue
            points = dict(secagg.split_secret(seed, len(self.ctx.group), self.ctx.threshold))
            for holder in holders:
                plain = points[self.ctx.x_of(holder)].to_bytes(SHARE_BYTES, "big")
                shares.append([partner, holder, bytes(SecretBox(self._keys[holder][1]).encrypt(plain))])
        meta = msgpack.packb({"v": 1, "shares": shares}, use_bin_type=True)
        return MAGIC + struct.pack("<I", len(meta)) + meta + masked.astype("<u4").tobytes()

    def answer(self, request: list[tuple[str, str, bytes]], survivors: Sequence[str],
               dropped: Sequence[str]) -> list[tuple[str, str, int]]:
        """Decrypt the shares the leader forwards: (owner, dropped, ciphertext) -> (owner, dropped, y).

        Only shares of a seed between a survivor and a dropped member may be requested. A
        member refuses a request about its own seeds, which would expose its masks, and it
        answers for one split of the group only: a leader that asked again, naming as dropped
        a member it had received, could rebuild that member's masks and read its update.
        """
        split = (frozenset(survivors), frozenset(dropped))
        if (self.me not in split[0] or not split[1] or split[0] & split[1]
                or split[0] | split[1] != set(self.ctx.group)):
            raise WireError(WireReason.ROUND,
                            "recovery request does not split the group into survivors and dropped members")
        if self._split is not None and self._split != split:
            raise WireError(WireReason.ROUND, "a second recovery request names other dropped members")
        out = []
        for owner, partner, ciphertext in request:
            if self.me in (owner, partner) or owner not in self._keys:
                raise WireError(WireReason.ROUND, "recovery request names this node's own seed")
            if owner not in split[0] or partner not in split[1]:
                raise WireError(WireReason.ROUND, f"recovery request asks for the seed of {owner[-8:]} and "
                                         f"{partner[-8:]}, which is not a survivor's seed with a dropped member")
            try:
                plain = SecretBox(self._keys[owner][1]).decrypt(ciphertext)
            except CryptoError:
                raise WireError(WireReason.GARBLED, f"share from {owner[-8:]} does not decrypt") from None
            out.append((owner, partner, int.from_bytes(plain, "big")))
        self._split = split
        return out


def decode_masked(payload: bytes, size: int) -> MaskedUpdate:
    """A leader's side of the wire format: MAGIC, meta length, msgpack meta, uint32 ring vector."""
    try:
        if payload[:4] != MAGIC:
            raise ValueError("no secure-aggregation header")
        (length,) = struct.unpack_from("<I", payload, 4)
        meta = msgpack.unpackb(payload[8 : 8 + length], raw=False)
        body = payload[8 + length :]
        shares = {(str(p), str(h)): bytes(c) for p, h, c in meta["shares"]}
    except Exception as exc:  # untrusted bytes may fail msgpack or the unpacking in any way
        raise WireError(WireReason.GARBLED, f"masked delta could not be decoded ({exc})") from None
    if len(body) != size * 4:
        raise WireError(WireReason.GARBLED, f"masked delta has {len(body)} bytes, expected {size * 4}")
    return MaskedUpdate(np.frombuffer(body, dtype="<u4").astype(secagg.RING_DTYPE), shares)


@dataclass
class SecAggReducer:
    """A leader's side: sums masked updates in the ring, plain ones (its own, partials) apart.

    The result is the weighted mean of everything; the masked part is unmasked only as a sum.
    """

    ctx: GroupContext
    _ring: np.ndarray | None = None
    _weight: int = 0
    _received: dict[str, MaskedUpdate] = field(default_factory=dict)
    _plain: WeightedAccumulator = field(default_factory=WeightedAccumulator)
    _answers: dict[tuple[str, str], list[secagg.Share]] = field(default_factory=dict)
    _answered: set[str] = field(default_factory=set)

    @property
    def count(self) -> int:
        return len(self._received) + self._plain.count

    @property
    def answered(self) -> set[str]:
        return set(self._answered)

    def add(self, vector: Folded, weight: float, reporter: str) -> None:
        if not isinstance(vector, MaskedUpdate):
            if reporter in self.ctx.group:
                raise WireError(WireReason.ROUND, f"{reporter[-8:]} must send a masked update")
            # A job under secure aggregation sends no sparse deltas (its spec refuses codec = "sparse").
            self._plain.add(vector.dense() if isinstance(vector, SparseVector) else vector, weight)
            return
        if reporter not in self.ctx.group or reporter in self._received:
            raise WireError(WireReason.ROUND, f"masked update from {reporter[-8:]}, not a masking member here")
        self._received[reporter] = vector
        self._weight += int(weight)
        self._ring = secagg.ring_sum([vector.ring] if self._ring is None else [self._ring, vector.ring])

    def missing(self) -> list[str]:
        """Masking members whose update never arrived: their partners' masks dangle."""
        return [m for m in self.ctx.group if m not in self._received] if self._received else []

    def survivors(self) -> list[str]:
        return sorted(self._received)

    def recovery_requests(self) -> dict[str, list[tuple[str, str, bytes]]]:
        """For each survivor, the encrypted shares addressed to it about the dropped seeds."""
        dropped = set(self.missing())
        out: dict[str, list[tuple[str, str, bytes]]] = {s: [] for s in self._received}
        for owner, update in self._received.items():
            for (partner, holder), ciphertext in update.shares.items():
                if partner in dropped and holder in out:
                    out[holder].append((owner, partner, ciphertext))
        return {h: reqs for h, reqs in out.items() if reqs}

    def add_answers(self, holder: str, answers: list[tuple[str, str, int]]) -> None:
        if holder not in self._received:
            raise WireError(WireReason.ROUND, f"recovery answer from {holder[-8:]}, who is not a survivor")
        if holder in self._answered:
            raise WireError(WireReason.ROUND, f"second recovery answer from {holder[-8:]}")
        dropped = set(self.missing())
        for owner, partner, y in answers:
            if owner not in self._received or partner not in dropped or holder in (owner, partner):
                raise WireError(WireReason.ROUND, f"recovery answer from {holder[-8:]} has a share nobody asked for")
            if not 0 <= y < secagg.PRIME:
                raise WireError(WireReason.GARBLED, f"recovery answer from {holder[-8:]} has a share outside the field")
        self._answered.add(holder)
        for owner, partner, y in answers:
            self._answers.setdefault((owner, partner), []).append((self.ctx.x_of(holder), y))

    def check_recoverable(self) -> None:
        """Raise SecAggError when more members dropped than the threshold lets the sum survive."""
        dropped, size = len(self.missing()), len(self.ctx.group)
        most = secagg.tolerated_dropouts(size, self.ctx.threshold)
        if dropped > most:
            raise secagg.SecAggError(
                f"{dropped} of {size} masked members dropped; with threshold {self.ctx.threshold} "
                f"at most {most} can be recovered")

    def plain_result(self) -> np.ndarray | None:
        """The mean of the clear inputs alone: what is left when the masked sum is lost."""
        return self._plain.result() if self._plain.count else None

    def result(self) -> np.ndarray:
        if self._ring is None:
            return self._plain.result()
        dropped = self.missing()
        total = self._ring
        if dropped:
            self.check_recoverable()
            seeds = {(v, u): secagg.combine_shares(self._answers.get((v, u), []), self.ctx.threshold)
                     for v in self._received for u in dropped}
            total = secagg.remove_dangling(total, seeds)
        secagg.check_capacity(self._weight, self.ctx.clip_range)
        mean = secagg.dequantize(total, self._weight)
        if self._plain.count == 0:
            return mean
        combined = WeightedAccumulator()
        combined.add(mean, float(self._weight))
        combined.add(self._plain.result(), self._plain.total_weight)
        return combined.result()


# -- dropout recovery on the wire ---------------------------------------------------------------


def recovery_frames(identity: Identity, red: SecAggReducer) -> dict[str, bytes]:
    """The leader's signed request to each survivor that holds shares of a dangling seed."""
    ctx, survivors, dropped = red.ctx, red.survivors(), red.missing()
    return {holder: seal(identity, SECAGG_RECOVER, {
        "job": ctx.job, "round": ctx.round, "attempt": ctx.attempt, "leader": identity.peer_id,
        "survivors": survivors, "dropped": dropped, "shares": [list(item) for item in items]})
        for holder, items in red.recovery_requests().items()}


def answer_recovery(identity: Identity, side: SecAggMember, req: RecoveryRequest) -> bytes:
    """A survivor's signed answer to its own leader's request for this round attempt."""
    ctx = side.ctx
    if (req.job, req.round, req.attempt) != (ctx.job, ctx.round, ctx.attempt):
        raise WireError(WireReason.ROUND, f"recovery request for round {req.round} attempt {req.attempt}, "
                                 f"this node masked in round {ctx.round} attempt {ctx.attempt}")
    if req.leader != ctx.leader:
        raise WireError(WireReason.ROUND,
                        f"recovery request from {req.leader[-8:]}, who does not lead this node's group")
    shares = side.answer(req.shares, req.survivors, req.dropped)
    return seal(identity, SECAGG_SHARES, {
        "job": ctx.job, "round": ctx.round, "attempt": ctx.attempt, "holder": identity.peer_id,
        "request": req.env.digest, "shares": [[o, d, y.to_bytes(SHARE_BYTES, "big")] for o, d, y in shares]})


def accept_answer(red: SecAggReducer, holder: str, reply: WireValue, request: bytes) -> None:
    """Check a survivor's answer against the request it was sent, then fold its shares in."""
    if not isinstance(reply, bytes):
        raise WireError(WireReason.GARBLED, f"recovery answer from {holder[-8:]} is not a signed frame")
    ans = parse_recovery_answer(open_envelope(reply, expect_kind=SECAGG_SHARES))
    ctx = red.ctx
    if ans.holder != holder:
        raise WireError(WireReason.IMPERSONATION, f"recovery answer from {holder[-8:]} is signed by {ans.holder[-8:]}")
    if (ans.job, ans.round, ans.attempt) != (ctx.job, ctx.round, ctx.attempt) or (
            ans.request != open_envelope(request).digest):
        raise WireError(WireReason.ROUND, f"recovery answer from {holder[-8:]} does not match its request")
    red.add_answers(holder, ans.shares)
