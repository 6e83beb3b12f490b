from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.base58 import b58decode, b58encode
from mesh.identity import Identity, IdentityError, public_key_from_peer_id, verify


def test_key_file_is_private_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    ident, created = Identity.load_or_create(path)
    assert created
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again, created = Identity.load_or_create(path)
    assert not created and again.peer_id == ident.peer_id


def test_readable_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    Identity.generate().save(path)
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        Identity.load(path)


def test_damaged_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    path.write_bytes(b"not a key")
    os.chmod(path, 0o600)
    with pytest.raises(IdentityError):
        Identity.load(path)


def test_peer_id_is_the_libp2p_peer_id() -> None:
    from libp2p.peer.id import ID

    ident = Identity.generate()
    assert ID.from_pubkey(ident.libp2p_keypair().public_key).to_base58() == ident.peer_id
    assert public_key_from_peer_id(ident.peer_id) == ident.public_key


def test_signatures_verify_only_with_the_right_key() -> None:
    a, b = Identity.generate(), Identity.generate()
    sig = a.sign(b"msg")
    assert verify(a.public_key, b"msg", sig)
    assert not verify(b.public_key, b"msg", sig)
    assert not verify(a.public_key, b"msg!", sig)


def test_a_remembered_signature_still_passes_only_for_its_own_key_message_and_signature() -> None:
    """``verify`` remembers triples that verified: the second look passes, and no other key,
    message or signature rides on it (a flipped bit in any of them still fails)."""
    a, b = Identity.generate(), Identity.generate()
    message = b"nodeinfo " * 100
    sig = a.sign(message)
    assert verify(a.public_key, message, sig)
    assert verify(a.public_key, message, sig)  # remembered now
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert not verify(a.public_key, message, flipped)
    assert not verify(b.public_key, message, sig)
    assert not verify(a.public_key, message + b"!", sig)
    assert not verify(a.public_key, message, sig[:63])


@given(st.binary(max_size=64))
def test_base58_round_trip(data: bytes) -> None:
    assert b58decode(b58encode(data)) == data
