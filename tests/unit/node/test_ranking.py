from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.node.core.ranking import coordinator_ranking, rendezvous_rank

PEERS = [f"peer{i}" for i in range(12)]


def simulate(job: str, members: list[str], rounds: int) -> list[str]:
    history: list[str] = []
    for r in range(1, rounds + 1):
        history.append(coordinator_ranking(job, r, members, history)[0])
    return history


def test_every_node_computes_the_same_ranking() -> None:
    a = coordinator_ranking("job", 3, PEERS[:6], ["peer1"])
    b = coordinator_ranking("job", 3, list(reversed(PEERS[:6])), ["peer1"])
    assert a == b and sorted(a) == sorted(PEERS[:6])


@given(st.text(min_size=1, max_size=12), st.integers(4, 12))
@settings(max_examples=200)
def test_coordinator_changes_every_round_with_four_or_more_members(job: str, n: int) -> None:
    history = simulate(job, PEERS[:n], 8)
    assert all(a != b for a, b in itertools.pairwise(history))


@given(st.text(min_size=1, max_size=12))
@settings(max_examples=200)
def test_six_members_see_at_least_three_coordinators_in_four_rounds(job: str) -> None:
    assert len(set(simulate(job, PEERS[:6], 4))) >= 3


def test_retry_attempt_promotes_the_next_backup() -> None:
    first = coordinator_ranking("job", 1, PEERS[:5])
    retry = coordinator_ranking("job", 1, PEERS[:5], attempt=1)
    assert retry[0] == first[1] and retry[-1] == first[0]


def test_rendezvous_depends_on_round() -> None:
    assert len({tuple(rendezvous_rank("job", r, PEERS)) for r in range(1, 6)}) > 1


@given(st.integers(0, 20), st.integers(1, 50), st.sets(st.sampled_from(PEERS[:6])))
def test_private_members_rank_last_in_every_attempt(attempt: int, round_: int, private: set[str]) -> None:
    members = PEERS[:6]
    ranking = coordinator_ranking("job", round_, members, [], attempt, private=private)
    assert sorted(ranking) == sorted(members)
    reach = [p for p in ranking if p not in private]
    assert ranking[: len(reach)] == reach  # every reachable member before any private one
    assert coordinator_ranking("job", round_, members, [], attempt) == \
        coordinator_ranking("job", round_, members, [], attempt, private=())


@given(st.text(min_size=1, max_size=12), st.integers(0, 20), st.sampled_from(PEERS[:6]))
def test_round_1_owner_leads_and_retries_rotate_through_everyone(job: str, attempt: int, owner: str) -> None:
    members = PEERS[:6]
    ranked = coordinator_ranking(job, 1, members, [], 0, first=owner)
    assert ranked[0] == owner
    assert ranked[1:] == [p for p in rendezvous_rank(job, 1, members) if p != owner]
    # Each attempt still hands the turn to the next one, so a silent owner costs one attempt.
    leads = {coordinator_ranking(job, 1, members, [], a, first=owner)[0] for a in range(attempt, attempt + 6)}
    assert leads == set(members)


def test_an_owner_that_is_no_member_changes_nothing() -> None:
    assert coordinator_ranking("job", 1, PEERS[:5], first="stranger") == coordinator_ranking("job", 1, PEERS[:5])
