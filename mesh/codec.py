"""Signed, versioned msgpack envelopes: the only way application data crosses the wire.

Every byte that arrives from a peer is untrusted. ``open_envelope`` is the single gate: any
problem at all (garbage, truncation, an oversized frame, a bad signature, an unknown schema
version or kind, a stale timestamp, a replayed nonce) becomes one typed ``WireError`` whose
message says what was wrong, so callers log it, drop the message and keep serving.

One signed message has one id. A frame is ``msgpack([header, signature])`` and the signature
covers the header bytes only, so the outer array could be re-encoded (wider length prefixes)
by anyone, without a key, into another valid frame. Ids (``digest``, ``msg_id``) therefore hash
exactly the signed bytes, never the frame; and a frame must be in the one canonical encoding
``seal`` writes, so what a node stores and forwards is byte-for-byte what its signer sent.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgpack

from mesh.compat import StrEnum
from mesh.errors import MeshError
from mesh.identity import Identity, peer_id_from_public_key, verify

SCHEMA_VERSION = 1
SIGNING_DOMAIN = b"gpuflex/envelope/v1\0"
MAX_FRAME = 16 * 1024 * 1024
DEFAULT_KIND_LIMIT = 1024 * 1024

# Per-kind size limits; layers above register their own kinds with ``register_kind``.
_KIND_LIMITS: dict[str, int] = {
    "nodeinfo": 64 * 1024,
    "have": 16 * 1024,
    "ping": 1024,
}


class WireReason(StrEnum):
    """Why untrusted input was rejected: the codes a rejection is logged, counted and
    penalised by (``mesh.inbound.PENALTY``). Plain strings on the wire of events and logs."""

    GARBLED = "garbled"  # not the schema: a missing field, a wrong type, bad msgpack
    TRUNCATED = "truncated"  # a frame or stream that ended early
    STALLED = "stalled"  # a stream that sent nothing for too long
    OVERSIZED = "oversized"  # over its kind's or its job's size limit
    SIGNATURE = "signature"  # a signature that does not verify
    VERSION = "version"  # an unknown schema version
    KIND = "kind"  # an unknown or unexpected message kind
    STALE = "stale"  # outside the replay window
    REPLAY = "replay"  # a (sender, nonce) already seen
    IMPERSONATION = "impersonation"  # signed by someone other than who it names
    AUTH = "auth"  # a secured channel whose handshake or frame fails authentication
    HASH = "hash"  # bytes that do not match their hash
    ROUND = "round"  # inconsistent with the round it names (plan, attempt, base, members)
    EVIDENCE = "evidence"  # a result whose evidence does not hold


class WireError(MeshError, ValueError):
    """Untrusted input that was rejected; ``reason`` says why (``WireReason``)."""

    def __init__(self, reason: WireReason | str, message: str) -> None:
        reason = WireReason(reason)  # a code outside the vocabulary is a bug here, not input
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class Truncated(WireError):
    """A stream or frame ended early; ``received`` bytes of it had arrived.

    A peer that closes before sending anything (``received == 0``) most likely timed out or
    crashed; one that stops half way may be cutting frames on purpose."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(WireReason.TRUNCATED, message)
        self.received = received


def register_kind(kind: str, max_bytes: int = DEFAULT_KIND_LIMIT) -> None:
    if not 0 < max_bytes <= MAX_FRAME:
        raise ValueError(f"size limit for {kind!r} must be in 1..{MAX_FRAME}")
    _KIND_LIMITS[kind] = max_bytes


def kind_limit(kind: str) -> int:
    return _KIND_LIMITS[kind]


@dataclass(frozen=True)
class Envelope:
    kind: str
    sender: str
    public_key: bytes
    ts: float
    nonce: bytes
    body: Any
    raw: bytes
    signed: bytes  # the header bytes the signature covers (after SIGNING_DOMAIN)

    # Both hashes are kept once computed (the dataclass is frozen, its bytes never change): a
    # plan's digest is what every update for it signs, and checking a result's evidence
    # compared each of its updates with it, hashing a plan that lists every member once per
    # update, members² bytes a result; a ledger's chain check hashes every result again.
    @cached_property
    def msg_id(self) -> bytes:
        """Gossip de-duplication id: BLAKE2b-128 of the signed bytes."""
        return hashlib.blake2b(SIGNING_DOMAIN + self.signed, digest_size=16).digest()

    @cached_property
    def digest(self) -> str:
        """Hex BLAKE2b-256 of the signed bytes (``SIGNING_DOMAIN + header``): what hash chains,
        job ids and references point at. Nothing outside the signature enters it."""
        return hashlib.blake2b(SIGNING_DOMAIN + self.signed, digest_size=32).hexdigest()


def canonical_frame(header: bytes, signature: bytes) -> bytes:
    """The one encoding of a signed header: what ``seal`` writes and ``open_envelope`` accepts."""
    return msgpack.packb([header, signature], use_bin_type=True)


def seal(identity: Identity, kind: str, body: Any, *, ts: float | None = None) -> bytes:
    """Sign ``body`` as a message of ``kind`` from ``identity``."""
    if kind not in _KIND_LIMITS:
        raise ValueError(f"unregistered message kind {kind!r}")
    header = msgpack.packb(
        {
            "v": SCHEMA_VERSION,
            "k": kind,
            "p": identity.public_key,
            "t": int((time.time() if ts is None else ts) * 1000),
            "n": os.urandom(16),
            "b": body,
        },
        use_bin_type=True,
    )
    frame = canonical_frame(header, identity.sign(SIGNING_DOMAIN + header))
    if len(frame) > _KIND_LIMITS[kind]:
        raise ValueError(f"{kind} message of {len(frame)} bytes exceeds its {_KIND_LIMITS[kind]} byte limit")
    return frame


def _reject_ext(code: int, data: bytes) -> Any:
    raise WireError(WireReason.GARBLED, f"msgpack extension type {code} is not allowed")


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_reject_ext,
            max_bin_len=MAX_FRAME,
            max_str_len=MAX_FRAME,
            max_array_len=1_000_000,
            max_map_len=1_000_000,
        )
    except WireError:
        raise
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise WireError(WireReason.GARBLED, f"{what} is not valid msgpack ({exc.__class__.__name__})") from None
    except ValueError as exc:
        text = str(exc)
        reason = WireReason.TRUNCATED if "incomplete" in text.lower() else WireReason.GARBLED
        raise WireError(reason, f"{what} could not be decoded ({text})") from None
    except Exception as exc:  # untrusted bytes may fail msgpack in any other way
        raise WireError(WireReason.GARBLED, f"{what} could not be decoded ({exc.__class__.__name__})") from None


class ReplayGuard:
    """Rejects envelopes outside a time window or whose (sender, nonce) was already seen."""

    def __init__(self, window_s: float = 300.0, max_entries: int = 200_000) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def check(self, env: Envelope, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if abs(now - env.ts) > self.window_s:
            raise WireError(WireReason.STALE,
                            f"timestamp is {now - env.ts:+.0f}s away from now (window {self.window_s:.0f}s)")
        key = env.public_key + env.nonce
        if key in self._seen:
            raise WireError(WireReason.REPLAY, f"{env.kind} from {env.sender} was already received")
        self._seen[key] = env.ts
        while self._seen and (len(self._seen) > self.max_entries):
            self._seen.popitem(last=False)
        # Entries older than the window can never pass the time check again.
        while self._seen:
            _oldest_key, oldest_ts = next(iter(self._seen.items()))
            if now - oldest_ts <= self.window_s:
                break
            self._seen.popitem(last=False)


def frame_msg_id(frame: bytes) -> bytes | None:
    """The ``msg_id`` a frame would have once opened, without checking its signature; None
    for a frame that is not a canonical [header, signature] pair.

    Gossip reaches a node up to D times; a copy whose id is already seen is dropped on this
    cheap look alone. The id hashes the signed header bytes, so a copy with the same id but a
    bad signature carries nothing the node does not already hold, verified."""
    try:
        outer = msgpack.unpackb(bytes(frame), raw=False, max_bin_len=MAX_FRAME, max_str_len=0,
                                max_array_len=2, max_map_len=0, max_ext_len=0)
    except Exception:  # msgpack raises several unrelated errors for garbage; open_envelope says which
        return None
    if not (isinstance(outer, list) and len(outer) == 2 and all(isinstance(x, bytes) for x in outer)):
        return None
    if bytes(frame) != canonical_frame(outer[0], outer[1]):
        return None
    return hashlib.blake2b(SIGNING_DOMAIN + outer[0], digest_size=16).digest()


def open_envelope(
    frame: bytes,
    *,
    expect_kind: str | None = None,
    replay: ReplayGuard | None = None,
    limits: Mapping[str, int] | None = None,
    now: float | None = None,
) -> Envelope:
    """Decode and verify an untrusted frame, or raise ``WireError``."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise WireError(WireReason.GARBLED, "frame is not bytes")
    frame = bytes(frame)
    if len(frame) > MAX_FRAME:
        raise WireError(WireReason.OVERSIZED, f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
    outer = _unpack(frame, "frame")
    if not (isinstance(outer, list) and len(outer) == 2 and all(isinstance(x, bytes) for x in outer)):
        raise WireError(WireReason.GARBLED, "frame is not [header, signature]")
    header_bytes, signature = outer
    if frame != canonical_frame(header_bytes, signature):
        raise WireError(WireReason.GARBLED, "frame is not in its canonical encoding (re-encoded by someone)")
    header = _unpack(header_bytes, "header")
    if not isinstance(header, dict):
        raise WireError(WireReason.GARBLED, "header is not a map")
    version = header.get("v")
    if version != SCHEMA_VERSION:
        raise WireError(WireReason.VERSION, f"unknown schema version {version!r} (this node speaks {SCHEMA_VERSION})")
    kind, pub, ts, nonce = header.get("k"), header.get("p"), header.get("t"), header.get("n")
    if not isinstance(kind, str) or not isinstance(pub, bytes) or len(pub) != 32:
        raise WireError(WireReason.GARBLED, "header lacks a kind or a 32-byte public key")
    if not isinstance(ts, int) or isinstance(ts, bool) or not isinstance(nonce, bytes) or len(nonce) != 16:
        raise WireError(WireReason.GARBLED, "header lacks a timestamp or a 16-byte nonce")
    if "b" not in header:
        raise WireError(WireReason.GARBLED, "header has no body")
    table = _KIND_LIMITS if limits is None else limits
    if kind not in table:
        raise WireError(WireReason.KIND, f"unknown message kind {kind!r}")
    if len(frame) > table[kind]:
        raise WireError(WireReason.OVERSIZED,
                        f"{kind} frame of {len(frame)} bytes exceeds its {table[kind]} byte limit")
    if expect_kind is not None and kind != expect_kind:
        raise WireError(WireReason.KIND, f"expected a {expect_kind} message, got {kind}")
    if not verify(pub, SIGNING_DOMAIN + header_bytes, signature):
        raise WireError(WireReason.SIGNATURE, f"bad signature on {kind} message")
    env = Envelope(
        kind=kind,
        sender=peer_id_from_public_key(pub),
        public_key=pub,
        ts=ts / 1000.0,
        nonce=nonce,
        body=header["b"],
        raw=frame,
        signed=header_bytes,
    )
    if replay is not None:
        replay.check(env, now)
    return env
