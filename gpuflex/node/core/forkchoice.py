"""Fork choice: which of two verified chains of a job every node settles on.

Pure functions of verified results (``ledger`` verifies; this orders): the heavier chain by
verified contributions, then the longer, then the earlier attempt and the smaller digest.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuflex.node.core.messages import Result


def result_key(res: Result) -> tuple[int, str]:
    """The last tie-break of fork choice: of two results for the same round, the earlier
    attempt wins, then the smaller digest. Neither can be climbed: each attempt names its own
    coordinator, and a digest covers exactly the signed bytes."""
    return (res.attempt, res.digest)


def round_weight(res: Result) -> int:
    """What one verified round weighs in fork choice: its counted contributions. A round that
    passed ``evidence.verify_round`` lists exactly its verified signed updates, one per
    distinct member of its plan, so the length of its contributor list is that count."""
    return len(res.contributors)


def chain_weight(chain: Sequence[Result]) -> int:
    """A verified chain's weight: the verified contributions summed over its rounds."""
    return sum(round_weight(r) for r in chain)


def prefer_chain(ours: Sequence[Result], theirs: Sequence[Result]) -> bool:
    """Whether a verified chain ``theirs`` should replace ``ours``.

    1. The heavier chain wins: more verified contributions summed over its rounds. Length
       alone would let a party holding ``min_nodes`` keys of a committed plan take an attempt
       it owns, commit rounds that count only its own updates, grow that branch privately
       faster than the mesh trains, and win. By weight, its branch must count more signed
       updates since the fork than the honest contributors did.
    2. At equal weight, the longer chain wins.
    3. Then the chain whose result wins where they first differ (``result_key``).

    Weight and length are properties of one chain and rule 3 is a lexicographic order, so this
    is one strict total order on verified chains: every node settles on the same ledger.

    A node behind on the same branch holds a prefix, lighter by every round it lacks (each
    counts at least ``min_nodes`` >= 1 contributions): it never pulls the mesh back. A root
    that commits a round and dies before its result goes out comes back with a branch nobody
    else holds; by then the mesh has retried that round and gone on. Judged at the fork alone,
    its earlier attempt would win, and, as no one can fetch its model while it restarts, the
    mesh would stall or stay split. By weight, the mesh's chain wins as soon as its rounds
    since the fork count more contributions than the root's one round (usually one round
    later); until then the root's branch is heavier and every node adopts it once the root
    serves its model. Either way all settle on one ledger."""
    weight_ours, weight_theirs = chain_weight(ours), chain_weight(theirs)
    if weight_theirs != weight_ours:
        return weight_theirs > weight_ours
    if len(theirs) != len(ours):
        return len(theirs) > len(ours)
    for a, b in zip(ours, theirs, strict=False):
        if a.digest != b.digest:
            return result_key(b) < result_key(a)
    return False
