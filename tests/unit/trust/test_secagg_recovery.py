"""Dropout recovery over signed messages: the leader's requests, the survivors' answers, and
every way a request or an answer can be wrong (no network: the frames are passed by hand)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from aggregation import secagg
from gpuflex.node.core.messages import (
    SECAGG_RECOVER,
    SECAGG_SHARES,
    SHARE_BYTES,
    parse_recovery_answer,
    parse_recovery_request,
    parse_secagg_reports,
)
from gpuflex.node.core.pipeline import secagg_context
from gpuflex.node.core.secure import (
    SecAggMember,
    SecAggReducer,
    accept_answer,
    answer_recovery,
    recovery_frames,
)
from gpuflex.node.recovery import collect_answers
from mesh.codec import WireError, open_envelope, seal
from mesh.identity import Identity
from tests.unit.trust.test_secagg import SPEC, group, run_group


def setting(drop: int = 1, members: int = 4) -> tuple[np.ndarray, SecAggReducer, dict[str, SecAggMember],
                                                       dict[str, Identity]]:
    expected, _, red, sides = run_group(drop=drop, members=members)
    ids, _ = group(members)
    return expected, red, sides, {i.peer_id: i for i in ids}


def answer(ids: dict[str, Identity], sides: dict[str, SecAggMember], holder: str, frame: bytes) -> bytes:
    req = parse_recovery_request(open_envelope(frame, expect_kind=SECAGG_RECOVER))
    return answer_recovery(ids[holder], sides[holder], req)


def leader_of(red: SecAggReducer, ids: dict[str, Identity]) -> Identity:
    return ids[red.ctx.leader]


def test_recovery_over_signed_messages_gives_the_survivors_sum() -> None:
    expected, red, sides, ids = setting(drop=1)
    frames = recovery_frames(leader_of(red, ids), red)
    assert set(frames) == set(red.survivors())
    for holder, frame in frames.items():
        accept_answer(red, holder, answer(ids, sides, holder, frame), frame)
    assert red.result() == pytest.approx(expected, abs=1e-4)


def test_request_for_another_round_or_from_another_node_is_refused() -> None:
    _, red, sides, ids = setting(drop=1)
    holder, frame = next(iter(recovery_frames(leader_of(red, ids), red).items()))
    body = open_envelope(frame).body
    for change, match in (({"round": body["round"] + 1}, "round 4 attempt 0"),
                          ({"job": "another-job"}, "round 3 attempt 0")):
        forged = seal(leader_of(red, ids), SECAGG_RECOVER, {**body, **change})
        with pytest.raises(WireError, match=match):
            answer(ids, sides, holder, forged)
    other = ids[red.survivors()[-1] if red.survivors()[-1] != holder else red.survivors()[0]]
    forged = seal(other, SECAGG_RECOVER, {**body, "leader": other.peer_id})
    with pytest.raises(WireError, match="does not lead"):
        answer(ids, sides, holder, forged)
    with pytest.raises(WireError, match="signed by its leader"):  # leader field and signer differ
        parse_recovery_request(open_envelope(seal(other, SECAGG_RECOVER, body)))


def test_member_answers_for_one_split_of_the_group_only() -> None:
    _, red, sides, ids = setting(drop=1)
    leader = leader_of(red, ids)
    holder, frame = next(iter(recovery_frames(leader, red).items()))
    body = open_envelope(frame).body
    # a survivor named as dropped: the split must cover the group exactly once
    bad = {**body, "dropped": body["dropped"] + [holder]}
    with pytest.raises(WireError, match="does not split the group"):
        answer(ids, sides, holder, seal(leader, SECAGG_RECOVER, bad))
    answer(ids, sides, holder, frame)
    # asking again, with another member declared dropped, would expose that member's masks
    survivors = [s for s in body["survivors"] if s != holder]
    moved = {**body, "survivors": [holder, *survivors[1:]], "dropped": [*body["dropped"], survivors[0]]}
    with pytest.raises(WireError, match="second recovery request"):
        answer(ids, sides, holder, seal(leader, SECAGG_RECOVER, moved))


def test_request_for_a_seed_between_two_survivors_is_refused() -> None:
    _, red, sides, ids = setting(drop=1)
    leader = leader_of(red, ids)
    holder, frame = next(iter(recovery_frames(leader, red).items()))
    body = open_envelope(frame).body
    others = [s for s in body["survivors"] if s != holder]
    owner, _, ciphertext = body["shares"][0]
    partner = next(s for s in others if s != owner)
    forged = {**body, "shares": [[owner, partner, ciphertext]]}
    with pytest.raises(WireError, match="not a survivor's seed with a dropped member"):
        answer(ids, sides, holder, seal(leader, SECAGG_RECOVER, forged))


def test_answer_from_a_non_survivor_a_stranger_or_for_another_request_is_rejected() -> None:
    _, red, sides, ids = setting(drop=1)
    frames = recovery_frames(leader_of(red, ids), red)
    holder, frame = next(iter(frames.items()))
    reply = answer(ids, sides, holder, frame)
    dropped = red.missing()[0]
    with pytest.raises(WireError, match="not a survivor"):
        red.add_answers(dropped, [])
    with pytest.raises(WireError, match="impersonation"):  # one survivor's answer passed off as another's
        accept_answer(red, next(h for h in frames if h != holder), reply, frame)
    other_frame = next(f for h, f in frames.items() if h != holder)
    with pytest.raises(WireError, match="does not match its request"):
        accept_answer(red, holder, reply, other_frame)
    with pytest.raises(WireError, match="not a signed frame"):
        accept_answer(red, holder, {"shares": []}, frame)
    accept_answer(red, holder, reply, frame)
    with pytest.raises(WireError, match="second recovery answer"):
        accept_answer(red, holder, reply, frame)


def test_answer_with_a_share_nobody_asked_for_is_rejected() -> None:
    _, red, _, _ = setting(drop=1)
    holder = red.survivors()[0]
    other = red.survivors()[1]
    with pytest.raises(WireError, match="nobody asked for"):
        red.add_answers(holder, [(other, red.survivors()[2], 5)])
    with pytest.raises(WireError, match="outside the field"):
        red.add_answers(holder, [(other, red.missing()[0], secagg.PRIME)])


def test_a_corrupted_share_is_caught_instead_of_giving_a_wrong_sum() -> None:
    # g = 5, threshold 2: every dangling seed has three surviving holders, one more than needed
    _, red, sides, ids = setting(drop=1, members=5)
    frames = recovery_frames(leader_of(red, ids), red)
    bad = next(iter(frames))
    for holder, frame in frames.items():
        shares = sides[holder].answer(*_request_args(frame))
        if holder == bad:
            shares = [(o, d, (y + 1) % secagg.PRIME) for o, d, y in shares]
        red.add_answers(holder, shares)
    with pytest.raises(secagg.SecAggError, match="disagree"):
        red.result()


def _request_args(frame: bytes) -> tuple[list, list, list]:
    req = parse_recovery_request(open_envelope(frame))
    return req.shares, list(req.survivors), list(req.dropped)


PRIME_THIRD = secagg.PRIME // 3


def test_combine_shares_checks_extra_shares_and_duplicates() -> None:
    secret = bytes(range(32))
    shares = secagg.split_secret(secret, 5, 2)
    assert secagg.combine_shares(shares, 2) == secret
    with pytest.raises(secagg.SecAggError, match="disagree"):
        secagg.combine_shares([*shares[:4], (5, shares[4][1] + 1)], 2)
    with pytest.raises(secagg.SecAggError, match="two different shares"):
        secagg.combine_shares([shares[0], (1, shares[0][1] + 1)], 2)
    # garbage with exactly t shares: it lands above the 2^256 seeds but for a 2^-265 chance
    with pytest.raises(secagg.SecAggError, match="valid seed"):
        secagg.combine_shares([shares[0], (2, (shares[1][1] + PRIME_THIRD) % secagg.PRIME)], 2)


def test_recovery_messages_reject_malformed_bodies() -> None:
    ident = Identity(b"\x05" * 32)
    good = {"job": "j", "round": 1, "attempt": 0, "holder": ident.peer_id, "request": "ab",
            "shares": [["a", "b", b"\0" * SHARE_BYTES]]}
    assert parse_recovery_answer(open_envelope(seal(ident, SECAGG_SHARES, good))).shares == [("a", "b", 0)]
    for bad, match in (({"shares": [["a", "b", b"\0" * 10]]}, "not 66 bytes"),
                       ({"shares": [["a", "b"]]}, "triples"),
                       ({"round": "1"}, "wrong type"),
                       ({"holder": "someone-else"}, "signed by the survivor")):
        with pytest.raises(WireError, match=match):
            parse_recovery_answer(open_envelope(seal(ident, SECAGG_SHARES, {**good, **bad})))
    with pytest.raises(ValueError, match="exceeds"):  # the size limit holds on the sending side too
        seal(ident, SECAGG_SHARES, {**good, "shares": [["a", "b", b"\0" * SHARE_BYTES]] * 40_000})
    report = {"leader": "l", "attempt": 0, "survivors": ["a"], "dropped": ["b"], "recovered": True,
              "reason": "", "extra": 1}
    assert parse_secagg_reports([report], "partial") == ({k: v for k, v in report.items() if k != "extra"},)
    with pytest.raises(WireError, match="recovered"):
        parse_secagg_reports([{**report, "recovered": "yes"}], "partial")


def test_scripted_dropout_hits_its_positions_in_attempt_zero_of_its_round_only() -> None:
    from tests.integration.dropout_node import ScriptedDropout

    ids, plan = group(4)
    ctx = secagg_context(SPEC, plan, ids[1].peer_id)
    assert ctx is not None and ctx.round == 3
    first, second = ctx.group[0], ctx.group[1]
    script = ScriptedDropout.parse("3:0")
    assert script.drops(ctx, first)
    assert not script.drops(ctx, second)
    retry = secagg_context(SPEC, SimpleNamespace(**{**vars(plan), "attempt": 1}), first)
    assert retry is not None and not script.drops(retry, first)
    assert not ScriptedDropout.parse("2:0").drops(ctx, first)
    with pytest.raises(ValueError):
        ScriptedDropout.parse("three:zero")


def test_a_node_honours_no_dropout_script_from_its_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The dropout lives in the test harness only: a node started normally ignores the variable
    the harness reads, and its fault hooks do nothing."""
    from gpuflex.node import faults
    from gpuflex.node.runtime import NodeOptions, NodeRuntime
    from tests.integration.dropout_node import DROP_ENV

    monkeypatch.setenv(DROP_ENV, "3:0")
    monkeypatch.setattr(faults, "_installed", None)
    hooks = NodeRuntime._faults(NodeOptions(home=tmp_path))
    assert hooks is faults.NO_FAULTS


async def test_round_trip_tolerates_a_silent_survivor_and_reports_a_bad_answer() -> None:
    import trio

    # g = 5, threshold 2: each dangling seed has three surviving holders, so one may stay silent
    expected, red, sides, ids = setting(drop=1, members=5)
    silent, garbled = red.survivors()[:2]
    faulty = {silent: "silent", garbled: "garbled"}

    async def request(holder: str, frame: bytes) -> object:
        if faulty.get(holder) == "silent":
            await trio.sleep_forever()
        return b"not a frame" if faulty.get(holder) == "garbled" else answer(ids, sides, holder, frame)

    problems = await collect_answers(leader_of(red, ids), red, request, timeout=0.5)
    assert set(problems) == {silent, garbled}
    assert isinstance(problems[silent], TimeoutError) and isinstance(problems[garbled], WireError)
    with pytest.raises(secagg.SecAggError, match="distinct shares"):  # two holders short: no sum
        red.result()

    expected, red, sides, ids = setting(drop=1, members=5)
    del faulty[garbled]
    assert set(await collect_answers(leader_of(red, ids), red, request, timeout=0.5)) == {silent}
    assert red.result() == pytest.approx(expected, abs=1e-4)
