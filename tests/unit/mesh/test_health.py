from __future__ import annotations

import pytest

from mesh.health import DOWN, SUSPECT, UP, HealthConfig, PeerTable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_states_follow_silence_thresholds() -> None:
    clock = Clock()
    table = PeerTable(HealthConfig(suspect_after_s=4, down_after_s=9), clock=clock)
    changes: list[tuple[str, str]] = []
    table.on_change(lambda rec, old, new: changes.append((old, new)))
    table.seen("p1", rtt_ms=1.0)
    assert table.get("p1").state == UP
    clock.now += 5
    table.reevaluate()
    assert table.get("p1").state == SUSPECT
    clock.now += 5
    table.reevaluate()
    assert table.get("p1").state == DOWN
    assert table.counts() == {"up": 0, "suspect": 0, "down": 1, "peers": 1}
    table.seen("p1")
    assert table.get("p1").state == UP
    assert changes == [("suspect", "up"), ("up", "suspect"), ("suspect", "down"), ("down", "up")]


def test_repeated_faults_get_a_peer_ignored_for_a_while() -> None:
    clock = Clock()
    table = PeerTable(HealthConfig(penalty_ignore_threshold=3, penalty_ignore_s=30), clock=clock)
    table.seen("bad")
    for _ in range(3):
        table.penalise("bad")
    assert table.is_ignored("bad")
    assert "bad" not in table.alive()
    clock.now += 31
    table.seen("bad")
    assert not table.is_ignored("bad")


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError):
        HealthConfig(suspect_after_s=10, down_after_s=5)


def test_a_vouched_member_is_up_by_hearsay_is_not_aged_by_silence_and_stays_down_once_down() -> None:
    clock = Clock()
    table = PeerTable(HealthConfig(suspect_after_s=4, down_after_s=9), clock=clock)
    table.add("heard-of")
    table.add("vouched")
    table.vouch("vouched")
    assert table.get("vouched").state == UP and table.get("vouched").last_seen is None
    assert table.alive() == ["vouched"]
    clock.now += 30
    table.reevaluate(unseen_only=True)
    assert table.get("vouched").state == UP  # failure detection judges it, not this node's silence
    assert table.get("heard-of").state == DOWN
    table.set_state("vouched", DOWN)
    table.vouch("vouched")
    assert table.get("vouched").state == DOWN  # hearsay never brings back a peer held down


def test_silence_ages_only_the_peers_asked_for() -> None:
    clock = Clock()
    table = PeerTable(HealthConfig(suspect_after_s=4, down_after_s=9), clock=clock)
    table.add("kept")
    table.add("elsewhere")
    version = table.version
    clock.now += 30
    table.reevaluate(unseen_only=True, among={"kept", "unknown"})
    assert table.get("kept").state == DOWN and table.get("elsewhere").state == SUSPECT
    assert table.version > version  # what depends on the membership (the overlay) sees the change


def test_the_kept_lists_of_peers_up_and_members_follow_every_change() -> None:
    """``alive`` and ``members`` are kept between changes of the table: a peer that goes down
    leaves them at once, an ignored one leaves them and comes back when its time is up, a new
    one joins them, and a caller that changes the list it got changes nothing kept."""
    clock = Clock()
    table = PeerTable(HealthConfig(suspect_after_s=4, down_after_s=9, penalty_ignore_threshold=1,
                                   penalty_ignore_s=30), clock=clock)
    for p in ("a", "b", "c"):
        table.seen(p)
    assert sorted(table.alive()) == ["a", "b", "c"]
    table.alive().append("x")
    assert "x" not in table.alive()
    table.set_state("a", DOWN)
    assert sorted(table.alive()) == ["b", "c"] and sorted(table.members()) == ["b", "c"]
    table.set_state("b", SUSPECT)
    assert table.alive() == ["c"] and sorted(table.members()) == ["b", "c"]
    table.penalise("c", 5)
    assert table.alive() == [] and table.members() == ["b"]
    clock.now += 31
    assert table.alive() == ["c"]
    table.seen("d")
    assert sorted(table.alive()) == ["c", "d"]
