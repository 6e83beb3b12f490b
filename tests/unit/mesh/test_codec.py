"""The envelope decoder is the gate for untrusted bytes: it must never crash, only reject."""

from __future__ import annotations

import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.codec import (
    SIGNING_DOMAIN,
    ReplayGuard,
    WireError,
    WireReason,
    frame_msg_id,
    open_envelope,
    register_kind,
    seal,
)
from mesh.identity import Identity

register_kind("test", 64 * 1024)
ALICE = Identity(bytes(range(32)))
MALLORY = Identity(bytes(range(1, 33)))
bodies = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20) | st.binary(max_size=40),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)


@given(bodies)
@settings(max_examples=150, deadline=None)
def test_round_trip(body: object) -> None:
    env = open_envelope(seal(ALICE, "test", body))
    assert env.body == body
    assert env.sender == ALICE.peer_id
    assert env.kind == "test"


@given(st.binary(max_size=2048))
@settings(max_examples=400, deadline=None)
def test_random_bytes_always_raise_the_typed_error(data: bytes) -> None:
    with pytest.raises(WireError):
        open_envelope(data)


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_any_mutated_byte_is_rejected(data: st.DataObject) -> None:
    frame = bytearray(seal(ALICE, "test", {"round": 3, "delta": b"x" * 64}))
    pos = data.draw(st.integers(0, len(frame) - 1))
    flip = data.draw(st.integers(1, 255))
    frame[pos] ^= flip
    with pytest.raises(WireError):
        open_envelope(bytes(frame))


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_cut_frames_are_rejected(data: st.DataObject) -> None:
    frame = seal(ALICE, "test", {"payload": b"y" * 200})
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(WireError) as info:
        open_envelope(frame[:cut])
    assert info.value.reason in {"truncated", "garbled"}


def _forge(header: dict, signer: Identity) -> bytes:
    raw = msgpack.packb(header, use_bin_type=True)
    return msgpack.packb([raw, signer.sign(SIGNING_DOMAIN + raw)], use_bin_type=True)


def _header(**overrides: object) -> dict:
    base = {"v": 1, "k": "test", "p": ALICE.public_key, "t": int(time.time() * 1000), "n": b"\1" * 16, "b": {}}
    base.update(overrides)
    return base


def test_forged_signature_is_rejected() -> None:
    # Mallory signs a message claiming to be Alice.
    with pytest.raises(WireError) as info:
        open_envelope(_forge(_header(), MALLORY))
    assert info.value.reason == "signature"


def test_unknown_version_is_rejected() -> None:
    with pytest.raises(WireError) as info:
        open_envelope(_forge(_header(v=2), ALICE))
    assert info.value.reason == "version"
    assert "version 2" in str(info.value)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(WireError) as info:
        open_envelope(_forge(_header(k="no-such-kind"), ALICE))
    assert info.value.reason == "kind"


def test_oversized_frame_is_rejected() -> None:
    register_kind("tiny", 200)
    big = _forge(_header(k="tiny", b=b"z" * 500), ALICE)
    with pytest.raises(WireError) as info:
        open_envelope(big)
    assert info.value.reason == "oversized"
    with pytest.raises(ValueError):
        seal(ALICE, "tiny", b"z" * 500)


def test_replay_and_stale_messages_are_rejected() -> None:
    guard = ReplayGuard(window_s=60)
    frame = seal(ALICE, "test", {"n": 1})
    open_envelope(frame, replay=guard)
    with pytest.raises(WireError) as info:
        open_envelope(frame, replay=guard)
    assert info.value.reason == "replay"
    old = seal(ALICE, "test", {"n": 2}, ts=time.time() - 3600)
    with pytest.raises(WireError) as info:
        open_envelope(old, replay=guard)
    assert info.value.reason == "stale"


def test_expected_kind_is_enforced() -> None:
    with pytest.raises(WireError):
        open_envelope(seal(ALICE, "test", {}), expect_kind="nodeinfo")


def test_extension_types_are_refused() -> None:
    raw = msgpack.packb(_header(b=msgpack.ExtType(5, b"abc")), use_bin_type=True)
    frame = msgpack.packb([raw, ALICE.sign(SIGNING_DOMAIN + raw)], use_bin_type=True)
    with pytest.raises(WireError):
        open_envelope(frame)


def _bin(data: bytes, width: int) -> bytes:
    """msgpack bin with a length prefix of ``width`` bytes (1, 2 or 4): valid, but not the shortest."""
    tag = {1: b"\xc4", 2: b"\xc5", 4: b"\xc6"}[width]
    return tag + len(data).to_bytes(width, "big") + data


@given(body=bodies, array=st.sampled_from([b"\x92", b"\xdc\x00\x02", b"\xdd\x00\x00\x00\x02"]),
       widths=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4])))
@settings(max_examples=150, deadline=None)
def test_a_re_encoded_frame_has_the_same_id_or_is_rejected(body: object, array: bytes, widths: tuple[int, int]) -> None:
    """Anyone can re-encode a frame's outer array without a key: the copy must not be a second
    valid message with its own id."""
    frame = seal(ALICE, "test", body)
    env = open_envelope(frame)
    header, signature = msgpack.unpackb(frame, raw=False)
    widths = (max(widths[0], 2) if len(header) > 255 else widths[0], widths[1])
    copy = array + _bin(header, widths[0]) + _bin(signature, widths[1])
    assert msgpack.unpackb(copy, raw=False) == [header, signature]  # a valid msgpack encoding
    if copy == frame:
        assert open_envelope(copy).digest == env.digest
        return
    with pytest.raises(WireError, match="canonical"):
        open_envelope(copy)


def test_ids_hash_exactly_the_signed_bytes() -> None:
    import hashlib

    frame = seal(ALICE, "test", {"x": 1})
    env = open_envelope(frame)
    header, _ = msgpack.unpackb(frame, raw=False)
    assert env.digest == hashlib.blake2b(SIGNING_DOMAIN + header, digest_size=32).hexdigest()
    assert env.msg_id == hashlib.blake2b(SIGNING_DOMAIN + header, digest_size=16).digest()


@given(bodies)
@settings(max_examples=60, deadline=None)
def test_frame_msg_id_is_the_opened_envelopes_id(body: object) -> None:
    """Gossip drops a repeated copy on this id before checking its signature: it must be the
    very id the opened envelope has, or a new message would be taken for a repeat."""
    frame = seal(ALICE, "test", body)
    assert frame_msg_id(frame) == open_envelope(frame).msg_id
    other = seal(ALICE, "test", body)  # a fresh nonce: another message
    assert frame_msg_id(other) != frame_msg_id(frame)


@given(st.binary(max_size=512))
@settings(max_examples=200, deadline=None)
def test_frame_msg_id_of_garbage_is_none_or_never_raises(data: bytes) -> None:
    out = frame_msg_id(data)
    assert out is None or len(out) == 16


def test_frame_msg_id_refuses_a_re_encoded_frame() -> None:
    header, signature = msgpack.unpackb(seal(ALICE, "test", {"x": 1}))
    wide = b"\x92" + b"\xc6" + len(header).to_bytes(4, "big") + header + b"\xc4" + bytes([len(signature)]) + signature
    assert msgpack.unpackb(wide) == [header, signature]
    assert frame_msg_id(wide) is None


def test_a_rejection_reason_is_one_of_the_wire_vocabulary() -> None:
    with pytest.raises(WireError) as info:
        open_envelope(_forge(_header(), MALLORY))
    assert info.value.reason is WireReason.SIGNATURE and info.value.reason == "signature"
    assert WireError("garbled", "a plain string reads as its reason").reason is WireReason.GARBLED
    with pytest.raises(ValueError):  # a reason outside the vocabulary is a bug where it is raised
        WireError("nonsense", "no such reason")
