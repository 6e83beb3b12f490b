"""A node's one Ed25519 identity.

The same key is the libp2p PeerID (so the Noise handshake authenticates it) and the key that
signs every application message, so a signature can be checked against the peer on the other
end of a stream without any extra key exchange.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from mesh.base58 import b58decode, b58encode
from mesh.errors import MeshError
from mesh.fsutil import atomic_write

if TYPE_CHECKING:
    from libp2p.crypto.keys import KeyPair

# libp2p encodes an Ed25519 public key as protobuf {Type: Ed25519 (1), Data: 32 bytes}, and
# the PeerID of such a short key is its identity multihash (code 0x00).
_PB_PREFIX = bytes([0x08, 0x01, 0x12, 0x20])
_MH_PREFIX = bytes([0x00, len(_PB_PREFIX) + 32])
KEY_FILE_MAGIC = b"GPUFLEX-ED25519-V1\n"


class IdentityError(MeshError, RuntimeError):
    """The key file is missing, malformed or too widely readable."""


@lru_cache(maxsize=8192)  # every verified message names its sender: base58 of a known key, again
def peer_id_from_public_key(public_key: bytes) -> str:
    if len(public_key) != 32:
        raise ValueError("an Ed25519 public key has 32 bytes")
    return b58encode(_MH_PREFIX + _PB_PREFIX + public_key)


def public_key_from_peer_id(peer_id: str) -> bytes:
    """Recover the signing key embedded in an Ed25519 PeerID."""
    try:
        raw = b58decode(peer_id)
    except ValueError as exc:
        raise ValueError(f"not a PeerID: {exc}") from None
    if len(raw) != 38 or not raw.startswith(_MH_PREFIX + _PB_PREFIX):
        raise ValueError("not an Ed25519 PeerID")
    return raw[6:]


#: Signatures remembered as checked (``verify``): an Ed25519 check costs ~50 µs, hashing the
#: same bytes ~1 µs per kB, and one signed record reaches a node many times (a peer's NodeInfo
#: in each peer-exchange answer and lookup, a round's contributions in every result that carries
#: them); in the simulator, one process holds a thousand nodes that each check the same records.
VERIFIED_CACHE = 1 << 16
_verified: OrderedDict[bytes, None] = OrderedDict()


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s over ``message``. A triple that verified once
    is remembered by its BLAKE2b-256 digest (bounded, least recently used first out): the check
    is deterministic, so a second look is a hash, and only a digest collision could pass a
    forgery. Failures are not remembered (a flood of bad signatures cannot evict good ones
    faster than a flood of good ones could)."""
    if not (isinstance(public_key, bytes) and isinstance(signature, bytes) and len(public_key) == 32
            and len(signature) == 64 and isinstance(message, (bytes, bytearray, memoryview))):
        return False
    digest = hashlib.blake2b(public_key + signature, digest_size=32)
    digest.update(message)
    key = digest.digest()
    if key in _verified:
        _verified.move_to_end(key)
        return True
    try:
        VerifyKey(public_key).verify(message, signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    _verified[key] = None
    if len(_verified) > VERIFIED_CACHE:
        _verified.popitem(last=False)
    return True


@dataclass(frozen=True)
class Identity:
    seed: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(32))

    # Derived once: deriving the key pair from the seed costs as much as a signature, and the
    # node reads its own key and id on every message it seals.
    @cached_property
    def signing_key(self) -> SigningKey:
        return SigningKey(self.seed)

    @cached_property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    @cached_property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self.signing_key.sign(message).signature

    def libp2p_keypair(self) -> KeyPair:
        from libp2p.crypto.ed25519 import create_new_key_pair

        return create_new_key_pair(self.seed)

    def x25519_private_key(self) -> bytes:
        """Curve25519 key for pairwise secrets, derived from the same identity."""
        return bytes(self.signing_key.to_curve25519_private_key())

    # -- storage ---------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic_write(path, KEY_FILE_MAGIC + self.seed.hex().encode() + b"\n", mode=0o600)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        target = Path(path)
        mode = stat.S_IMODE(target.stat().st_mode)
        if mode & 0o077:
            raise IdentityError(
                f"key file {target} has mode {mode:04o}; it must be readable by its owner only "
                f"(run: chmod 600 {target})"
            )
        raw = target.read_bytes()
        if not raw.startswith(KEY_FILE_MAGIC):
            raise IdentityError(f"key file {target} is not a GPUFlex key")
        try:
            seed = bytes.fromhex(raw[len(KEY_FILE_MAGIC) :].decode().strip())
        except ValueError:
            seed = b""
        if len(seed) != 32:
            raise IdentityError(f"key file {target} is damaged")
        return cls(seed)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> tuple[Identity, bool]:
        """Load the key, creating it on first start; returns (identity, created)."""
        target = Path(path)
        if target.exists():
            return cls.load(target), False
        ident = cls.generate()
        ident.save(target)
        return ident, True

