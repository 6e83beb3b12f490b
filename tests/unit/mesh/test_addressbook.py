"""The persisted address book: bounds, eviction order, atomic writes, corrupt and hostile files."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh import fsutil
from mesh.addressbook import (
    MAX_ADDR_LEN,
    MAX_ADDRS,
    MAX_FILE_BYTES,
    AddressBook,
    clean_addr,
)
from mesh.identity import Identity

SELF = Identity.generate().peer_id
IDS = [Identity.generate().peer_id for _ in range(12)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def addr(port: int) -> str:
    return f"/ip4/10.0.0.1/tcp/{port}"


def book(tmp_path: Path, max_peers: int = 256, clock: Clock | None = None) -> AddressBook:
    return AddressBook(tmp_path / "peers.json", SELF, max_peers=max_peers, clock=clock or Clock())


def test_clean_addr_accepts_transport_addresses_and_refuses_the_rest() -> None:
    peer = IDS[0]
    assert clean_addr(peer, "/ip4/127.0.0.1/tcp/4001") == "/ip4/127.0.0.1/tcp/4001"
    assert clean_addr(peer, f"/ip4/127.0.0.1/tcp/4001/p2p/{peer}") == "/ip4/127.0.0.1/tcp/4001"
    assert clean_addr(peer, "/dns4/node.example/tcp/4001") == "/dns4/node.example/tcp/4001"
    assert clean_addr(peer, "/ip6/::1/udp/4001/quic-v1") == "/ip6/::1/udp/4001/quic-v1"
    relay = f"/ip4/1.2.3.4/tcp/4001/p2p/{IDS[1]}/p2p-circuit"
    assert clean_addr(peer, relay) == relay
    for bad in (
        f"/ip4/127.0.0.1/tcp/4001/p2p/{IDS[1]}",  # another peer's address
        "/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001",  # cannot be dialled
        "/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/70000",
        "/unix/etc/passwd", "ip4/127.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/1\n", "/ip4/a b/tcp/1",
        "/ip4/127.0.0.1/tcp/1" + "/x" * MAX_ADDR_LEN, "", None, 4001, b"/ip4/127.0.0.1/tcp/1",
    ):
        assert clean_addr(peer, bad) is None, bad


def test_bounds_on_peers_addresses_and_strings(tmp_path: Path) -> None:
    b = book(tmp_path, max_peers=5)
    for i, peer in enumerate(IDS):
        b.seen(peer, [addr(1000 + i)])
    assert len(b) == 5
    # Hundreds of announced addresses: the first few are looked at, MAX_ADDRS kept.
    b.seen(IDS[-1], [addr(2000 + i) for i in range(500)])
    assert len(b.get(IDS[-1]).addrs) == MAX_ADDRS
    assert b.seen("not-a-peer-id", [addr(1)]) is None
    assert b.seen("Qm" + "a" * 500, [addr(1)]) is None
    assert b.seen(SELF, [addr(1)]) is None  # never itself
    assert b.hint(Identity.generate().peer_id, ["/ip4/0.0.0.0/tcp/1"]) is None  # nothing dialable: no slot
    assert len(b) == 5


def test_eviction_drops_the_least_reliable_then_the_oldest(tmp_path: Path) -> None:
    clock = Clock()
    b = book(tmp_path, max_peers=4, clock=clock)
    reached, seen_old, seen_new, hint = IDS[:4]
    b.reached(reached, addr(1))
    clock.now += 10
    b.seen(seen_old, [addr(2)])
    clock.now += 10
    b.seen(seen_new, [addr(3)])
    b.hint(hint, [addr(4)])
    clock.now += 10
    b.seen(IDS[4], [addr(5)])  # full: the hint goes first
    assert hint not in b and len(b) == 4
    clock.now += 10
    b.seen(IDS[5], [addr(6)])  # then the peer heard from longest ago
    assert seen_old not in b
    for _ in range(3):  # failed dials in a row count against a peer, even one reached before
        b.failed(reached, addr(1))
    clock.now += 10
    b.seen(IDS[6], [addr(7)])
    assert reached not in b
    assert [e.peer_id for e in b.best()] == [IDS[6], IDS[5], IDS[4], seen_new]


def test_hints_never_displace_peers_this_node_has_heard_from(tmp_path: Path) -> None:
    b = book(tmp_path, max_peers=8)
    verified = IDS[:4]
    for i, peer in enumerate(verified):
        b.seen(peer, [addr(100 + i)])
    for _ in range(200):  # a hostile peer passing on a flood of made-up peers
        b.hint(Identity.generate().peer_id, [addr(9)])
    assert all(p in b for p in verified)
    assert len(b) == 8
    assert {e.peer_id for e in b.best(4)} == set(verified)


def test_a_verified_peer_whose_dials_failed_keeps_its_place_ahead_of_every_hint(tmp_path: Path) -> None:
    """A peer that restarted fails a few dials; a hint flood meanwhile must not push it out, and
    a restarted node dials it before any hint."""
    b = book(tmp_path, max_peers=8)
    restarted, steady = IDS[:2]
    b.reached(restarted, addr(100))
    b.seen(steady, [addr(101)])
    for _ in range(20):
        b.failed(restarted, addr(100))
    for _ in range(200):
        b.hint(Identity.generate().peer_id, [addr(9)])
    assert restarted in b and steady in b and len(b) == 8
    assert [e.peer_id for e in b.best(2)] == [steady, restarted]


def test_the_address_that_worked_leads_and_a_failed_one_goes_last(tmp_path: Path) -> None:
    b = book(tmp_path)
    peer = IDS[0]
    b.seen(peer, [addr(1), addr(2), addr(3)])
    b.reached(peer, addr(3))
    assert b.get(peer).addrs[0] == addr(3)
    b.failed(peer, addr(3))
    assert b.get(peer).addrs == [addr(1), addr(2), addr(3)]
    assert b.get(peer).failures == 1
    b.reached(peer, addr(2))
    assert b.get(peer).failures == 0 and b.get(peer).addrs[0] == addr(2)
    # A peer that moved announces its new address first: it leads, the stale ones follow.
    b.seen(peer, [addr(9)])
    assert b.get(peer).addrs[0] == addr(9) and len(b.get(peer).addrs) == MAX_ADDRS


def test_save_and_load_round_trip_with_mode_0600(tmp_path: Path) -> None:
    clock = Clock()
    b = book(tmp_path, clock=clock)
    b.reached(IDS[0], addr(1))
    b.seen(IDS[1], [addr(2), addr(3)])
    b.failed(IDS[1], addr(2))
    b.save()
    assert not b.dirty
    assert stat.S_IMODE(os.stat(tmp_path / "peers.json").st_mode) == 0o600
    again = book(tmp_path, clock=clock)
    assert again.load() == 2
    assert again.joined == b.joined > 0
    assert [e.row() for e in again.best()] == [e.row() for e in b.best()]


def test_a_failed_write_keeps_the_previous_book(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path)
    b.seen(IDS[0], [addr(1)])
    b.save()
    before = (tmp_path / "peers.json").read_bytes()
    b.seen(IDS[1], [addr(2)])

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "replace", full_disk)
    with pytest.raises(fsutil.StateWriteError):
        b.save()
    assert b.dirty
    assert (tmp_path / "peers.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["peers.json"]  # no temporary file left behind


@pytest.mark.parametrize("content", [
    b"{not json", b"", b"[]", b'{"version": 99, "peers": []}', b'{"version": 1, "peers": {}}',
    b"\xff\xfe garbage", b'{"version": 1, "peers": [' + b"1," * 10 + b"1",  # torn mid-write
    b"[" * 200_000,  # nested past the parser's recursion limit
])
def test_a_corrupt_file_is_put_aside_and_the_node_starts_with_an_empty_book(
        tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "peers.json").write_bytes(content)
    b = book(tmp_path)
    with caplog.at_level(logging.WARNING, logger="mesh.addressbook"):
        assert b.load() == 0
    assert "unreadable" in caplog.text and "peers.json.corrupt" in caplog.text
    assert (tmp_path / "peers.json.corrupt").read_bytes() == content
    assert not b.joined
    b.seen(IDS[0], [addr(1)])
    b.save()
    assert book(tmp_path).load() == 1


def test_an_oversized_file_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "peers.json").write_bytes(b" " * (MAX_FILE_BYTES + 1))
    assert book(tmp_path).load() == 0
    assert (tmp_path / "peers.json.corrupt").exists()


def test_a_book_path_that_is_not_a_file_is_set_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "peers.json").mkdir()  # a directory (or a FIFO, a device) is never read
    with caplog.at_level(logging.WARNING, logger="mesh.addressbook"):
        assert book(tmp_path).load() == 0
    assert "not a regular file" in caplog.text
    assert (tmp_path / "peers.json.corrupt").is_dir()


def test_hostile_entries_are_skipped_and_times_clamped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    good = {"peer_id": IDS[0], "addrs": [addr(1)], "last_seen": clock.now - 5, "last_reached": 0,
            "last_failed": 0, "failures": 0}
    doc = {"version": 1, "joined": 1e300, "peers": [
        good,
        dict(good),  # a duplicate
        {**good, "peer_id": SELF},
        {**good, "peer_id": "../../etc/passwd"},
        {**good, "peer_id": IDS[1], "addrs": [f"/ip4/1.1.1.1/tcp/1/p2p/{IDS[2]}", "/ip4/0.0.0.0/tcp/1"]},
        {**good, "peer_id": IDS[3], "addrs": "/ip4/1.1.1.1/tcp/1"},
        {**good, "peer_id": IDS[4], "last_seen": 1e300, "failures": -5},  # from the future
        {**good, "peer_id": IDS[5], "last_seen": "yesterday", "failures": True, "addrs": [addr(i) for i in range(99)]},
        {**good, "peer_id": IDS[6], "last_seen": float("nan"), "failures": 10**12},
        "not an entry", None, [1, 2],
    ]}
    (tmp_path / "peers.json").write_text(json.dumps(doc, allow_nan=True))
    b = book(tmp_path, clock=clock)
    with caplog.at_level(logging.WARNING, logger="mesh.addressbook"):
        assert b.load() == 4
    assert "skipped 8 invalid entries" in caplog.text
    assert b.joined == clock.now  # clamped, not 1e300
    assert b.get(IDS[4]).last_seen == clock.now and b.get(IDS[4]).failures == 0
    assert len(b.get(IDS[5]).addrs) == MAX_ADDRS and b.get(IDS[5]).last_seen == 0
    assert b.get(IDS[6]).last_seen == 0 and b.get(IDS[6]).failures == 1000
    assert b.dirty  # rewritten clean on the next save


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)
entry_like = st.fixed_dictionaries({
    "peer_id": st.sampled_from([*IDS[:3], SELF]) | st.text(max_size=70),
    "addrs": st.lists(st.sampled_from([addr(1), addr(2), "/ip4/0.0.0.0/tcp/1"]) | st.text(max_size=40), max_size=8)
    | json_values,
    "last_seen": st.floats() | st.integers() | json_values,
    "failures": st.integers() | json_values,
})


@settings(max_examples=60, deadline=None)
@given(peers=st.lists(entry_like | json_values, max_size=8), joined=json_values)
def test_any_file_content_loads_into_a_valid_bounded_book(tmp_path_factory: pytest.TempPathFactory,
                                                          peers: list[object], joined: object) -> None:
    path = tmp_path_factory.mktemp("book") / "peers.json"
    path.write_text(json.dumps({"version": 1, "joined": joined, "peers": peers}, allow_nan=True))
    clock = Clock()
    b = AddressBook(path, SELF, max_peers=3, clock=clock)
    b.load()
    assert len(b) <= 3
    assert 0 <= b.joined <= clock.now
    for entry in b.best():
        assert entry.peer_id != SELF and 1 <= len(entry.addrs) <= MAX_ADDRS
        assert all(clean_addr(entry.peer_id, a) == a for a in entry.addrs)
        assert 0 <= entry.last_seen <= clock.now and 0 <= entry.failures <= 1000


def test_a_node_asked_for_any_port_gets_its_previous_one_back_when_free(tmp_path: Path) -> None:
    import socket

    from mesh.host import sticky_listen

    b = book(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        b.listening([f"/ip4/127.0.0.1/tcp/{port}", "not an address", "/ip4/0.0.0.0/tcp/4001"])
        b.save()
        again = book(tmp_path)
        again.load()
        assert again.listen == [f"/ip4/127.0.0.1/tcp/{port}", "/ip4/0.0.0.0/tcp/4001"]
        s.listen()  # taken: a fresh port then
        assert sticky_listen(["/ip4/127.0.0.1/tcp/0"], again.listen) == ["/ip4/127.0.0.1/tcp/0"]
    assert sticky_listen(["/ip4/127.0.0.1/tcp/0"], again.listen) == [f"/ip4/127.0.0.1/tcp/{port}"]
    # Only a port-0 address of the same host is replaced; an explicit port is the user's choice.
    assert sticky_listen(["/ip4/127.0.0.1/tcp/4002", "/ip4/10.0.0.1/tcp/0"], again.listen) == [
        "/ip4/127.0.0.1/tcp/4002", "/ip4/10.0.0.1/tcp/0"]


def test_meeting_any_peer_marks_the_node_as_having_been_in_a_mesh(tmp_path: Path) -> None:
    b = book(tmp_path)
    assert b.seen(IDS[0], []) is None  # its addresses are not known yet: no entry...
    assert b.joined > 0 and b.dirty  # ...but a restart must be patient from now on
    b.save()
    again = book(tmp_path)
    again.load()
    assert again.joined == b.joined and len(again) == 0
