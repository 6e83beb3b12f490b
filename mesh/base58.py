"""Base58btc, the alphabet libp2p uses to print PeerIDs.

Kept here so that identity and envelope checks never need to import libp2p, which costs
about a second: the CLI's query commands must start fast.
"""

from __future__ import annotations

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}


def b58encode(data: bytes) -> str:
    zeros = len(data) - len(data.lstrip(b"\0"))
    num = int.from_bytes(data, "big")
    out = []
    while num:
        num, rem = divmod(num, 58)
        out.append(ALPHABET[rem])
    return "1" * zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    num = 0
    for ch in text:
        if ch not in _INDEX:
            raise ValueError(f"invalid base58 character {ch!r}")
        num = num * 58 + _INDEX[ch]
    zeros = len(text) - len(text.lstrip("1"))
    body = num.to_bytes((num.bit_length() + 7) // 8, "big") if num else b""
    return b"\0" * zeros + body
