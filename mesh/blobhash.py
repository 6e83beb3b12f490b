"""What names a blob: its BLAKE3 hash, and the check that a peer's text is one.

Apart from the blob store and its transfers (``mesh.blob``) so that the layers that only
name blobs (the round messages, a ledger's audit) need neither trio nor a store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

import blake3

HASH_HEX_LEN = 64


def blob_hasher() -> Any:
    """An incremental hasher whose ``hexdigest()`` is the blob hash of what it was fed."""
    return blake3.blake3()


def blob_hash(data: bytes | memoryview) -> str:
    return blake3.blake3(data).hexdigest()


def parts_hash(parts: Sequence[bytes | memoryview]) -> str:
    """The blob hash of the concatenation of ``parts``, without joining them."""
    hasher = blob_hasher()
    for part in parts:
        hasher.update(part)
    return str(hasher.hexdigest())


def valid_hash(text: object) -> TypeGuard[str]:
    return isinstance(text, str) and len(text) == HASH_HEX_LEN and all(c in "0123456789abcdef" for c in text)
