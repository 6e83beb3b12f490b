"""Secure aggregation: ring math, Shamir recovery, and the member/leader code paths."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from aggregation import secagg
from gpuflex.jobspec import JobSpec
from gpuflex.node.core.pipeline import DeltaEncoder, decode_update, make_reducer, secagg_member
from gpuflex.node.core.secure import MaskedUpdate, SecAggReducer, mask_group, pairwise_keys
from mesh.identity import Identity

SPEC = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits", "secure_aggregation": True})
SIZE = 300


def group(members: int = 4) -> tuple[list[Identity], SimpleNamespace]:
    """A leader (index 0) with ``members`` childless children: one masking group."""
    ids = [Identity(bytes([i + 7]) * 32) for i in range(members + 1)]
    leader = ids[0].peer_id
    parent = {i.peer_id: (None if i.peer_id == leader else leader) for i in ids}
    plan = SimpleNamespace(job="job0000000000001", round=3, attempt=0, parent=parent)
    return ids, plan


def run_group(drop: int = 0, members: int = 4) -> tuple[np.ndarray, np.ndarray, SecAggReducer, dict]:
    ids, plan = group(members)
    rng = np.random.default_rng(0)
    deltas = {i.peer_id: rng.normal(0, 0.1, SIZE).astype(np.float32) for i in ids}
    samples = {i.peer_id: 10 + k for k, i in enumerate(ids)}
    leader = ids[0]
    red = make_reducer(SPEC, True, plan=plan, me=leader.peer_id)
    assert isinstance(red, SecAggReducer)
    enc = DeltaEncoder(SPEC)
    # the leader's own update goes in clear; the members mask theirs
    own = enc.encode(deltas[leader.peer_id], samples[leader.peer_id], secagg_member(SPEC, leader, plan))
    red.add(decode_update(SPEC, own, SIZE), samples[leader.peer_id], leader.peer_id)
    sides = {}
    for ident in ids[1 + drop:]:
        side = secagg_member(SPEC, ident, plan)
        assert side is not None
        sides[ident.peer_id] = side
        payload = enc.encode(deltas[ident.peer_id], samples[ident.peer_id], side)
        red.add(decode_update(SPEC, payload, SIZE), samples[ident.peer_id], ident.peer_id)
    present = [leader, *ids[1 + drop:]]
    weights = np.array([samples[i.peer_id] for i in present], dtype=np.float64)
    expected = np.average([deltas[i.peer_id] for i in present], axis=0, weights=weights)
    return expected, np.stack([deltas[i.peer_id] for i in ids]), red, sides


def test_quantize_round_trip_and_ring_wrap() -> None:
    vec = np.array([-1.5, 0.0, 0.25, 3.9], dtype=np.float32)
    q = secagg.quantize(vec, 3, clip_range=4.0)
    assert q.dtype == np.uint32
    assert secagg.dequantize(q, 3) == pytest.approx(vec, abs=2**-14)
    masks = secagg.prg(b"k" * 32, 4)
    assert secagg.dequantize(q + masks - masks, 3) == pytest.approx(vec, abs=2**-14)
    with pytest.raises(secagg.SecAggError, match="overflows"):
        secagg.check_capacity(10**6, 4.0)


def test_masks_cancel_in_the_sum() -> None:
    peers = ["a", "b", "c"]
    seeds = {("a", "b"): b"1" * 32, ("a", "c"): b"2" * 32, ("b", "c"): b"3" * 32}

    def seeds_of(me: str) -> dict[str, bytes]:
        return {o: s for (x, y), s in seeds.items() for o in (x, y) if me in (x, y) and o != me}

    vecs = {p: np.full(5, i + 1, dtype=np.float32) * 0.1 for i, p in enumerate(peers)}
    masked = [secagg.apply_masks(secagg.quantize(vecs[p], 1, 4.0), p, seeds_of(p)) for p in peers]
    assert secagg.dequantize(secagg.ring_sum(masked), 3) == pytest.approx(np.full(5, 0.2), abs=1e-4)


def test_shamir_split_and_recover() -> None:
    secret = bytes(range(32))
    shares = secagg.split_secret(secret, 5, 3)
    assert secagg.combine_shares(shares[1:4], 3) == secret
    assert secagg.combine_shares([shares[0], shares[2], shares[4]], 3) == secret
    with pytest.raises(secagg.SecAggError, match="3 are needed"):
        secagg.combine_shares(shares[:2], 3)
    with pytest.raises(secagg.SecAggError):
        secagg.split_secret(secret, 2, 3)


def test_pairwise_keys_agree_and_differ_per_round() -> None:
    ids, plan = group(2)
    from gpuflex.node.core.pipeline import secagg_context

    ctx = secagg_context(SPEC, plan, ids[1].peer_id)
    assert ctx is not None
    a, b = ids[1], ids[2]
    assert pairwise_keys(a, b.peer_id, ctx) == pairwise_keys(b, a.peer_id, ctx)
    other = secagg_context(SPEC, SimpleNamespace(**{**vars(plan), "round": 4}), a.peer_id)
    assert other is not None and pairwise_keys(a, b.peer_id, other) != pairwise_keys(a, b.peer_id, ctx)


def test_masked_sum_equals_plain_sum() -> None:
    expected, _, red, _ = run_group()
    assert red.missing() == []
    assert red.result() == pytest.approx(expected, abs=1e-4)


def test_leader_sees_only_masked_vectors() -> None:
    ids, plan = group(4)
    member = secagg_member(SPEC, ids[1], plan)
    assert member is not None and secagg_member(SPEC, ids[0], plan) is None  # the leader masks nothing
    delta = np.random.default_rng(1).normal(0, 0.1, 20000).astype(np.float32)
    seen = decode_update(SPEC, DeltaEncoder(SPEC).encode(delta, 10, member), delta.size)
    assert isinstance(seen, MaskedUpdate)
    readable = secagg.dequantize(seen.ring, 10)
    # uniform over the ring: mean ~ 0 at a scale of 2^31 / (2^14 * 10), no correlation with the delta
    assert abs(float(np.corrcoef(readable, delta)[0, 1])) < 0.05
    assert float(np.std(readable)) > 1000 * float(np.std(delta))
    assert abs(float(np.mean(seen.ring / 2**32)) - 0.5) < 0.01
    # the seed shares travel encrypted: no plaintext share value appears in the payload
    assert all(len(c) == 24 + 16 + 66 for c in seen.shares.values())


def test_recovery_with_one_member_gone() -> None:
    expected, _, red, sides = run_group(drop=1)
    assert len(red.missing()) == 1
    with pytest.raises(secagg.SecAggError, match="distinct shares"):
        red.result()
    for holder, request in red.recovery_requests().items():
        red.add_answers(holder, sides[holder].answer(request, red.survivors(), red.missing()))
    assert red.result() == pytest.approx(expected, abs=1e-4)


def test_recovery_fails_clearly_when_too_many_are_gone() -> None:
    _, _, red, sides = run_group(drop=3, members=4)
    for holder, request in red.recovery_requests().items():
        red.add_answers(holder, sides[holder].answer(request, red.survivors(), red.missing()))
    with pytest.raises(secagg.SecAggError, match=r"3 of 4 masked members dropped.*at most 1"):
        red.result()


def test_member_refuses_to_reveal_its_own_seeds() -> None:
    _, _, red, sides = run_group(drop=1)
    holder, request = next(iter(red.recovery_requests().items()))
    forged = [(holder, dropped, ct) for _, dropped, ct in request]
    with pytest.raises(ValueError, match="own seed"):
        sides[holder].answer(forged, red.survivors(), red.missing())


def test_mask_group_of_a_tree() -> None:
    parent = {"r": None, "a": "r", "b": "r", "l": "r", "c": "l", "d": "l"}
    assert mask_group(parent, "a") == ("r", ("a", "b"))
    assert mask_group(parent, "l") == ("l", ("c", "d"))  # a leader's own update is not masked
    assert mask_group(parent, "c") == ("l", ("c", "d"))
    assert secagg.tolerated_dropouts(4, secagg.default_threshold(4)) == 1


def test_masked_update_outside_its_group_is_refused() -> None:
    ids, plan = group(3)
    payload = DeltaEncoder(SPEC).encode(np.zeros(SIZE, np.float32), 5, secagg_member(SPEC, ids[1], plan))
    masked = decode_update(SPEC, payload, SIZE)
    plain = JobSpec.from_dict({"model": "mlp", "data": "sklearn-digits"})
    median = JobSpec.from_dict({**plain.to_dict(), "rule": "median"})
    for reducer in (make_reducer(plain, True), make_reducer(median, True)):
        with pytest.raises(ValueError, match="outside its group"):
            reducer.add(masked, 5.0, ids[1].peer_id)  # type: ignore[arg-type]
