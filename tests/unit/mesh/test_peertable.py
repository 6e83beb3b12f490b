"""The peer table's bounds (mesh.peertable): keys seen only as signers or penalty targets get
no entry, hints never crowd out peers this node heard from, and eviction drops what other
layers keep per peer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.health import UP, HealthConfig, PeerTable
from mesh.peertable import MAX_MARKS, hint_quota, stranger, stranger_quota


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def table(max_peers: int = 16) -> PeerTable:
    return PeerTable(HealthConfig(max_peers=max_peers, penalty_ignore_threshold=3), clock=Clock())


def test_a_penalised_key_that_is_not_a_peer_gets_a_mark_not_an_entry() -> None:
    t = table()
    for i in range(3 * MAX_MARKS // 2):
        t.penalise(f"signer{i}", 5.0)
    assert t.all() == [] and t.alive() == [] and t.counts()["peers"] == 0
    assert t.is_ignored(f"signer{3 * MAX_MARKS // 2 - 1}")  # recent marks are kept ...
    assert not t.is_ignored("signer0")  # ... the oldest forgotten: the marks are bounded
    t.seen(f"signer{3 * MAX_MARKS // 2 - 1}")  # it connects: an entry, penalty and all
    rec = t.get(f"signer{3 * MAX_MARKS // 2 - 1}")
    assert rec is not None and rec.penalty == 5.0 and t.is_ignored(rec.peer_id)


def test_hints_take_at_most_their_quota_and_never_push_out_live_peers() -> None:
    t = table(16)
    evicted: list[str] = []
    t.on_evict(evicted.append)
    for i in range(12):
        t.reached(f"live{i}")
    for i in range(500):
        t.add(f"hint{i}", [f"/ip4/10.0.0.1/tcp/{i + 1}"])
    ids = {r.peer_id for r in t.all()}
    assert {f"live{i}" for i in range(12)} <= ids
    assert len(ids) <= 16 and len(ids - {f"live{i}" for i in range(12)}) <= hint_quota(16)
    assert "hint499" in ids and "hint0" not in ids and "hint0" in evicted


def test_a_full_table_of_live_peers_turns_a_hint_and_a_stranger_away_but_makes_room_for_a_peer_it_reached() -> None:
    t = table(8)
    for i in range(8):
        t.reached(f"live{i}")
    rec = t.add("hint", ["/ip4/10.0.0.1/tcp/1"])
    assert "hint" not in t and rec.addrs  # detached: nothing kept for it
    t.seen("stranger")  # it connected; this node never reached it
    assert "stranger" not in t and len(t.all()) == 8
    t.get("live3").last_seen = 1.0  # the one silent longest
    t.reached("newcomer")
    assert "newcomer" in t and "live3" not in t and len(t.all()) == 8


def test_strangers_take_at_most_their_quota_and_the_worst_stranger_goes_first() -> None:
    t = table(64)
    evicted: list[str] = []
    t.on_evict(evicted.append)
    for i in range(12):
        t.reached(f"live{i}")
    for i in range(500):
        t.seen(f"stranger{i}")
    ids = {r.peer_id for r in t.all()}
    assert {f"live{i}" for i in range(12)} <= ids and len(ids) <= 64
    assert len(ids - {f"live{i}" for i in range(12)}) == stranger_quota(64)
    assert "stranger499" in ids and "stranger0" not in ids and "stranger0" in evicted
    t.reached("stranger499")  # this node reached it: no longer a stranger
    assert t.get("stranger499").row()["reached"] is True


def test_an_evicted_peer_keeps_its_penalty_as_a_mark() -> None:
    t = table(8)
    t.add("bad", ["/ip4/10.0.0.1/tcp/1"])
    for _ in range(3):
        t.penalise("bad")
    for i in range(8):
        t.seen(f"live{i}")
    assert "bad" not in t and t.is_ignored("bad")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["seen", "reached", "add", "penalise"]), st.integers(0, 100)),
                min_size=60, max_size=300),
       st.integers(8, 24))
def test_any_sequence_stays_within_the_caps(ops: list[tuple[str, int]], max_peers: int) -> None:
    t = table(max_peers)
    live = set()
    for op, n in ops:
        peer = f"p{n}"
        if op == "seen":
            t.seen(peer)
            live.add(peer)
        elif op == "reached":
            t.reached(peer)
        elif op == "add":
            t.add(peer, ["/ip4/10.0.0.1/tcp/1"])
        else:
            t.penalise(peer)
        recs = t.all()
        assert len(recs) <= max_peers
        assert sum(r.last_seen is None for r in recs) <= hint_quota(max_peers)
        assert sum(stranger(r) for r in recs) <= stranger_quota(max_peers)
        full_of_reached = len(recs) == max_peers and all(r.reached and r.state == UP for r in recs)
        if op == "reached" or (op == "seen" and not full_of_reached):
            assert t.get(peer) is not None and t.get(peer).state == UP
