"""Signed records stored in the Kademlia DHT.

py-libp2p's DHT accepts any value for an unknown namespace, so GPUFlex registers a validator
for each of its namespaces: a record must be a valid envelope of the right kind signed by the
peer named in the key, and among several copies the newest wins.
"""

from __future__ import annotations

from mesh.codec import WireError, open_envelope

NODEINFO_NS = "gfnode"


def nodeinfo_key(peer_id: str) -> str:
    return f"/{NODEINFO_NS}/{peer_id}"


class RecordValidator:
    """libp2p ``Validator`` for envelopes keyed by their signer's PeerID."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def validate(self, key: str, value: bytes) -> None:
        try:
            env = open_envelope(value, expect_kind=self.kind)
        except WireError as exc:
            raise ValueError(f"invalid {self.kind} record: {exc}") from None
        owner = key.rsplit("/", 1)[-1]
        if env.sender != owner:
            raise ValueError(f"{self.kind} record for {owner} is signed by {env.sender}")

    def select(self, key: str, values: list[bytes]) -> int:
        best, best_ts = 0, float("-inf")
        for i, value in enumerate(values):
            try:
                env = open_envelope(value, expect_kind=self.kind)
            except WireError:
                continue
            if env.ts > best_ts:
                best, best_ts = i, env.ts
        return best
