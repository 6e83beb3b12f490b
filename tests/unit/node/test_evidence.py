"""A committed round's evidence (``gpuflex.node.core.evidence``) and fork choice
(``gpuflex.node.core.ledger.prefer_chain``): each forgery an attacker can sign with its own keys is
refused for the reason it names, and fork choice is one total order that grinding, a large
attempt number or a re-encoding cannot climb."""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.node.core.evidence import ChainRules, EvidenceError, cap_from, verify_round
from gpuflex.node.core.forkchoice import prefer_chain, result_key
from gpuflex.node.core.ledger import Ledger, LedgerError, verify_chain
from gpuflex.node.core.ranking import coordinator_ranking
from mesh.codec import WireError, open_envelope
from mesh.identity import Identity
from tests.unit.node.chain import JOB, STRANGER, make_chain, next_round, parsed, rules_for


def check(frames: list[bytes], frame: bytes, ids: list[Identity], **rules: object) -> list:
    return verify_round(parsed([frame])[0], parsed(frames), rules_for(ids, **rules))


def test_an_honest_next_round_verifies() -> None:
    frames, ids = make_chain(2)
    counted = check(frames, next_round(frames, ids), ids)
    assert sorted(u.peer for u in counted) == sorted(i.peer_id for i in ids)


def test_a_plan_from_a_member_whose_attempt_it_is_not_is_refused() -> None:
    frames, ids = make_chain(2)
    owner = rules_for(ids).expected_coordinator(parsed(frames), 0)
    other = next(i for i in ids if i.peer_id != owner)
    with pytest.raises(EvidenceError, match="attempt 0 belongs to"):
        check(frames, next_round(frames, ids, coord=other), ids)


def test_any_attempt_names_one_coordinator_and_each_member_owns_one_attempt_in_n() -> None:
    frames, ids = make_chain(2)
    rules, history = rules_for(ids), parsed(frames)
    owners = [rules.expected_coordinator(history, a) for a in range(len(ids))]
    assert sorted(owners) == sorted(i.peer_id for i in ids)  # a rotation: nobody owns two
    big = 2**31 - 2
    owner = rules.expected_coordinator(history, big)
    assert owner == owners[big % len(ids)]
    # One ranking gives every attempt's (presence looks past the homes' turns with it).
    order = rules.coordinator_order(history)
    assert order == owners
    assert rules.coordinator_order([]) == [rules.expected_coordinator([], a) for a in range(len(ids))]
    # A huge attempt is just another attempt: only its owner's plan counts for it.
    other = next(i for i in ids if i.peer_id != owner)
    with pytest.raises(EvidenceError, match=f"attempt {big} belongs to"):
        check(frames, next_round(frames, ids, attempt=big, coord=other), ids)


def test_a_stranger_is_not_eligible_to_coordinate() -> None:
    frames, ids = make_chain(1)
    history = parsed(frames)
    rules = rules_for(ids)
    assert all(rules.expected_coordinator(history, a) != STRANGER.peer_id for a in range(8))
    with pytest.raises(EvidenceError, match="belongs to"):
        check(frames, next_round(frames, [*ids, STRANGER], coord=STRANGER), ids)


def test_round_one_is_checked_against_the_jobs_members_and_an_audit_skips_only_that() -> None:
    _, ids = make_chain(1)
    forged = next_round([], [*ids, STRANGER], coord=STRANGER)
    with pytest.raises(EvidenceError, match="round 1: plan signed by"):
        check([], forged, ids)
    # An offline audit (no member list) cannot check round 1's coordinator, and says so in
    # ChainRules; from round 2 on the ledger itself names who may coordinate.
    verify_chain([forged], JOB)


def test_round_one_is_the_owners_first_and_each_later_attempt_the_next_ones() -> None:
    _, ids = make_chain(1)
    plain = rules_for(ids).expected_coordinator([], 0)
    owner = next(i for i in ids if i.peer_id != plain)  # an owner the hash alone would not rank first
    rules = rules_for(ids, owner=owner.peer_id)
    owners = [rules.expected_coordinator([], a) for a in range(len(ids))]
    assert owners[0] == owner.peer_id and sorted(owners) == sorted(i.peer_id for i in ids)
    assert check([], next_round([], ids, rules=rules), ids, owner=owner.peer_id)
    with pytest.raises(EvidenceError, match=f"attempt 0 belongs to {owner.peer_id[-8:]}"):
        check([], next_round([], ids, coord=next(i for i in ids if i.peer_id == plain)), ids, owner=owner.peer_id)
    # From round 2 on the owner is one member like the others.
    frames, _ = make_chain(1)
    assert rules.expected_coordinator(parsed(frames), 0) == rules_for(ids).expected_coordinator(parsed(frames), 0)


def test_an_allowlisted_job_refuses_a_coordinator_or_member_off_the_list() -> None:
    frames, ids = make_chain(1)
    history = parsed(frames)
    listed = [i.peer_id for i in ids[:2]]
    rules = rules_for(ids, allowlist=tuple(listed))
    # The third member was in round 1's plan, but the allowlist excludes it: never eligible.
    assert all(rules.expected_coordinator(history, a) in listed for a in range(6))
    with pytest.raises(EvidenceError, match="outside the job's allowlist"):
        verify_round(parsed([next_round(frames, ids)])[0], history, rules)


def test_a_round_with_no_updates_claiming_99_contributors_is_refused() -> None:
    frames, ids = make_chain(2)
    with pytest.raises(EvidenceError, match="0 verified contributions < min_nodes=2"):
        check(frames, next_round(frames, ids, signers=[], claim=99), ids)


def test_min_nodes_counts_signed_updates_not_the_metric() -> None:
    frames, ids = make_chain(2)
    with pytest.raises(EvidenceError, match="1 verified contributions < min_nodes=2"):
        check(frames, next_round(frames, ids, signers=ids[:1], claim=3), ids)
    with pytest.raises(EvidenceError, match="claims 5 contributors, 3 signed"):
        check(frames, next_round(frames, ids, claim=5), ids)


def test_an_update_signed_for_another_plan_does_not_count() -> None:
    frames, ids = make_chain(2)
    with pytest.raises(EvidenceError, match="not made for this plan"):
        check(frames, next_round(frames, ids, update_plan="0" * 64), ids)


def test_an_update_from_a_peer_outside_the_plan_does_not_count() -> None:
    frames, ids = make_chain(2)
    frame = next_round(frames, [*ids, STRANGER], members=[i.peer_id for i in ids])
    with pytest.raises(EvidenceError, match="not made for this plan"):
        check(frames, frame, ids)


def test_the_plans_sample_cap_must_be_the_one_the_previous_round_implies() -> None:
    frames, ids = make_chain(2)  # round 2's weights: 10, 11, 12
    implied = cap_from(4.0, [10, 11, 12])
    assert implied == 44
    with pytest.raises(EvidenceError, match="caps samples at 0, the previous round implies 44"):
        check(frames, next_round(frames, ids), ids, sample_cap_factor=4.0)
    counted = check(frames, next_round(frames, ids, sample_cap=44, samples=10**12), ids, sample_cap_factor=4.0)
    assert [u.samples for u in counted] == [44, 44, 44]  # a claim weighs at most the cap
    fixed = check(frames, next_round(frames, ids, sample_cap=7, samples=10**12), ids, max_samples=7)
    assert {u.samples for u in fixed} == {7}


def test_a_re_encoded_result_is_refused_and_its_digest_is_the_signed_bytes_hash() -> None:
    frames, _ = make_chain(1)
    header, signature = msgpack.unpackb(frames[0], raw=False)
    wider = b"\xdc\x00\x02" + b"\xc6" + len(header).to_bytes(4, "big") + header + b"\xc4" + bytes([64]) + signature
    assert wider != frames[0] and msgpack.unpackb(wider, raw=False) == [header, signature]
    with pytest.raises(WireError, match="canonical"):
        open_envelope(wider)
    # Every nonce or field change is a new signature over new bytes; the frame's own encoding
    # is not: one signed message, one id.
    assert open_envelope(frames[0]).digest == open_envelope(msgpack.packb([header, signature])).digest


def test_a_ledger_refuses_a_forged_next_round_and_keeps_its_own(tmp_path) -> None:
    frames, ids = make_chain(2)
    ledger = Ledger(tmp_path / "ledger.msgpack", JOB, rules_for(ids))
    ledger.replace(frames)
    forged = next_round(frames, ids, signers=[], claim=99)
    with pytest.raises(LedgerError, match="round 3: 0 verified contributions"):
        ledger.append(forged, parsed([forged])[0])
    assert ledger.frames == frames


# -- fork choice ---------------------------------------------------------------------------------


def test_at_equal_length_the_earlier_attempt_wins_whatever_the_digests() -> None:
    frames, ids = make_chain(2)
    history = parsed(frames)
    honest = next_round(frames, ids, attempt=0)
    for attempt in (1, 2, 2**31 - 2):
        rival = next_round(frames, ids, attempt=attempt, model=f"rival{attempt}")
        check(frames, rival, ids)  # valid evidence, signed by its attempt's owner
        ours, theirs = [*history, *parsed([honest])], [*history, *parsed([rival])]
        assert not prefer_chain(ours, theirs) and prefer_chain(theirs, ours)


def test_a_longer_chain_wins_only_with_every_round_verified(tmp_path) -> None:
    frames, ids = make_chain(2)
    ours = [*frames, next_round(frames, ids)]
    # A rival branch from round 2 that is one round longer: each round signed by its
    # attempt's owner and min_nodes members, it wins, as a retried round's chain must.
    branch = [frames[0]]
    for model in ("b2", "b3", "b4"):
        branch.append(next_round(branch, ids, attempt=1 if len(branch) == 1 else 0, model=model))
    rules = rules_for(ids)
    assert prefer_chain(verify_chain(ours, JOB, rules), verify_chain(branch, JOB, rules))
    # The same length from a stranger's rounds, however many it claims, does not verify.
    fake = [frames[0]]
    for model in ("f2", "f3", "f4", "f5"):
        fake.append(next_round(fake, [*ids, STRANGER], coord=STRANGER, signers=[STRANGER], claim=99, model=model))
    with pytest.raises(LedgerError, match="round 2: plan signed by"):
        verify_chain(fake, JOB, rules)


@dataclass(frozen=True)
class Node:
    """A result as fork choice sees it: a digest, an attempt and its counted contributors."""

    digest: str
    attempt: int
    contributors: tuple[str, ...] = ("a", "b")


@st.composite
def forks(draw: st.DrawFn) -> list[list[Node]]:
    """Three to five chains that share prefixes (a tree of forks), as a partitioned mesh holds,
    their rounds counting one to four contributions."""
    trunk = [Node(f"t{i}", 0) for i in range(draw(st.integers(0, 3)))]
    chains = []
    for c in range(draw(st.integers(3, 5))):
        cut = draw(st.integers(0, len(trunk)))
        tail = [Node(f"c{c}r{i}-{draw(st.sampled_from('0123456789abcdef'))}", draw(st.integers(0, 2**31 - 2)),
                     ("p",) * draw(st.integers(1, 4)))
                for i in range(draw(st.integers(0, 4)))]
        chains.append([*trunk[:cut], *tail])
    return chains


@settings(max_examples=100, deadline=None)
@given(forks())
def test_fork_choice_is_one_strict_total_order(chains: list[list[Node]]) -> None:
    distinct = {tuple(c) for c in chains}
    for a in distinct:
        assert not prefer_chain(list(a), list(a))
        for b in distinct:
            if a != b:  # exactly one of two different chains wins
                assert prefer_chain(list(a), list(b)) != prefer_chain(list(b), list(a))
            for c in distinct:
                if prefer_chain(list(a), list(b)) and prefer_chain(list(b), list(c)):
                    assert prefer_chain(list(a), list(c))
    # Every node, whichever chain it starts from and in whatever order it hears the others,
    # settles on the same one.
    settled = set()
    for start in distinct:
        held = list(start)
        for offer in sorted(distinct, key=lambda c: (c == start, len(c))):
            if prefer_chain(held, list(offer)):
                held = list(offer)
        for offer in distinct:  # a second pass changes nothing
            assert not prefer_chain(held, list(offer))
        settled.add(tuple(held))
    assert len(settled) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abcdef", min_size=1, max_size=4), min_size=1, max_size=12, unique=True),
       st.integers(0, 10), st.integers(0, 2**31 - 2))
def test_an_attempt_names_exactly_one_member_and_a_rotation_covers_them_all(members: list[str], round_: int,
                                                                            attempt: int) -> None:
    ranked = [coordinator_ranking(JOB, round_ + 1, members, (), a)[0] for a in range(len(members))]
    assert sorted(ranked) == sorted(members)
    assert coordinator_ranking(JOB, round_ + 1, members, (), attempt)[0] == ranked[attempt % len(members)]


def test_result_key_orders_attempt_before_digest() -> None:
    frames, ids = make_chain(1)
    a0 = parsed([next_round(frames, ids, attempt=0, model="x")])[0]
    a1 = parsed([next_round(frames, ids, attempt=1, model="y")])[0]
    assert result_key(a0) < result_key(a1)
    assert ChainRules(job=JOB).sample_cap([]) is None


@pytest.mark.parametrize(("signers", "quorum", "counts"), [
    (2, True, False),  # two of the last round's five: not most of them
    (3, True, True),  # three of five: most
    (2, False, True),  # an allowlisted job: only min_nodes (the allowlist keeps strangers out)
])
def test_an_open_job_counts_a_round_only_with_most_of_the_last_rounds_contributors(
        signers: int, quorum: bool, counts: bool) -> None:
    frames, ids = make_chain(2, members=5)
    rules = rules_for(ids, quorum=quorum)
    owner = rules.expected_coordinator(parsed(frames), 0)
    coord = next(i for i in ids if i.peer_id == owner)
    keys = [coord, *[i for i in ids if i is not coord][: signers - 1]]
    frame = next_round(frames, ids, rules=rules, coord=coord, signers=keys)
    if counts:
        assert len(check(frames, frame, ids, quorum=quorum)) == signers
    else:
        needs = r"2 of the recent rounds' contributors contributed; an open job needs 3"
        with pytest.raises(EvidenceError, match=needs):
            check(frames, frame, ids, quorum=quorum)


def test_an_open_jobs_rules_ask_for_the_quorum_and_an_allowlisted_jobs_do_not() -> None:
    from tests.unit.node.fakenet import fast_spec

    ids = [f"peer{i}" for i in range(3)]
    assert ChainRules.for_job(JOB, fast_spec(), ids).quorum
    assert not ChainRules.for_job(JOB, fast_spec(allowlist=ids), ids).quorum


def test_a_round_that_left_members_out_does_not_let_the_rest_commit_without_them_next() -> None:
    """Three of five commit a round (most of them), leaving two out; the next round still
    needs most of all five, so two of those three cannot commit it alone."""
    frames, ids = make_chain(2, members=5)
    rules = rules_for(ids, quorum=True)

    def by(keys: int, history: list[bytes]) -> bytes:
        owner = rules.expected_coordinator(parsed(history), 0)
        coord = next(i for i in ids if i.peer_id == owner)
        members = [coord, *[i for i in ids if i is not coord and i.peer_id in rules.eligible(parsed(history))]]
        return next_round(history, ids, rules=rules, coord=coord, signers=members[:keys])

    shrunk = by(3, frames)
    assert len(check(frames, shrunk, ids, quorum=True)) == 3
    with pytest.raises(EvidenceError, match="an open job needs 3"):
        check([*frames, shrunk], by(2, [*frames, shrunk]), ids, quorum=True)
    assert len(check([*frames, shrunk], by(3, [*frames, shrunk]), ids, quorum=True)) == 3
