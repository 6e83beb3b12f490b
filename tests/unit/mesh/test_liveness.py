"""Failure detection (mesh.liveness) under trio's MockClock, over a modelled transport.

The transport is a stand-in (one layer under test): a peer either echoes pings, refuses
them at once (a killed process: its sockets are closed), or never answers (a stalled one).
Everything else, the probe schedule, indirect probes, suspicion, rumours, refutation and
redial backoff, is the production code, timed by trio's clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import pairwise
from typing import Any

import trio

from mesh.codec import open_envelope, seal
from mesh.health import DOWN, SUSPECT, UP, HealthConfig, PeerTable, protocol_clock
from mesh.identity import Identity
from mesh.liveness import (
    MAX_PROBES_PER_PERIOD,
    PING_REQ,
    PROBES_PER_PERIOD,
    RUMOUR,
    Liveness,
    Verdict,
)
from mesh.messaging import HandlerTable, Inbound

CFG = HealthConfig(ping_interval_s=2.0, ping_timeout_s=2.0, suspect_after_s=4.0, down_after_s=9.0)


class EchoStream:
    def __init__(self, net: Net, peer: str) -> None:
        self.net, self.peer, self.buf = net, peer, b""

    async def write(self, data: bytes) -> None:
        if self.peer in self.net.dead:
            raise OSError("connection reset")
        if self.peer in self.net.stalled:
            await trio.sleep_forever()
        self.buf += data

    async def read(self, n: int) -> bytes:
        if self.peer in self.net.dead:
            raise OSError("connection reset")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    async def reset(self) -> None:
        pass


class Net:
    """Who is dead or stalled, seen from the node under test; and who its helpers can reach."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.stalled: set[str] = set()
        self.unreachable_from_here: set[str] = set()


class Host:
    """What Liveness uses of a MeshNode (LivenessHost), over ``Net``."""

    def __init__(self, net: Net, peers: list[str], redial_ok: bool = True) -> None:
        self.identity = Identity.generate()
        self.peer_id = self.identity.peer_id
        self.peers = PeerTable(CFG, clock=protocol_clock)
        self.handlers = HandlerTable()
        self.net, self.ids = net, peers
        self.rumours: list[tuple[float, dict[str, Any]]] = []
        self.redials: list[float] = []
        self.direct: list[tuple[dict[str, Any], list[str]]] = []
        self.redial_ok = redial_ok
        self.connected: set[str] = set(peers)
        for p in peers:  # learnt, as discovery would, not yet reached
            self.peers.add(p)

    def watch_set(self) -> set[str]:
        return set(self.ids)

    def keep_set(self) -> set[str]:
        return self.watch_set()

    def connected_ids(self) -> set[str]:
        return self.connected

    async def open(self, peer: str, protocol: str, timeout: float) -> Any:
        if peer in self.net.dead or peer in self.net.unreachable_from_here:
            raise OSError("connection refused")
        return EchoStream(self.net, peer)

    async def request(self, peer: str, frame: bytes, payload: bytes | None = None, timeout: float = 30.0) -> Any:
        env = open_envelope(frame)
        assert env.kind == PING_REQ
        target = env.body["peer"]
        return {"ok": target not in self.net.dead and target not in self.net.stalled}

    async def broadcast(self, frame: bytes) -> int:
        env = open_envelope(frame, expect_kind=RUMOUR)
        self.rumours.append((trio.current_time(), env.body))
        return 1

    async def send_direct(self, frame: bytes, peers: list[str]) -> int:
        self.direct.append((open_envelope(frame).body, peers))
        return len(peers)

    async def redial(self, peer: str) -> bool:
        self.redials.append(trio.current_time())
        return self.redial_ok


def peer_ids(n: int) -> list[str]:
    return [Identity.generate().peer_id for _ in range(n)]


async def wait_state(host: Host, peer: str, state: Any, limit: float) -> float:
    start = trio.current_time()
    with trio.fail_after(limit):
        while host.peers.get(peer).state != state:  # type: ignore[union-attr]
            await trio.sleep(0.1)
    return trio.current_time() - start


@asynccontextmanager
async def running(n: int) -> AsyncIterator[tuple[Net, list[str], Host, Liveness]]:
    """Liveness running over ``n`` peers, once it has reached every one of them."""
    net, ids = Net(), peer_ids(n)
    host = Host(net, ids)
    live = Liveness(host, CFG)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live.run)
        for p in ids:
            await wait_state(host, p, UP, 10)
        yield net, ids, host, live
        nursery.cancel_scope.cancel()


async def test_a_killed_peer_is_suspected_then_down_within_the_bound(autojump_clock) -> None:
    async with running(10) as (net, ids, host, live):
        victim = ids[3]
        net.dead.add(victim)
        # Worst case: the victim was probed just before it died, so it waits a whole turn of
        # the watched peers (10 / PROBES_PER_PERIOD periods), then the suspicion timeout.
        turn = len(ids) / PROBES_PER_PERIOD * CFG.ping_interval_s
        took = await wait_state(host, victim, DOWN, turn + CFG.ping_interval_s + live.suspicion_s + 1)
        assert took >= live.suspicion_s
        said = [(b["peer"], b["state"]) for _, b in host.rumours]
        assert (victim, "suspect") in said and (victim, "down") in said
        assert said.index((victim, "suspect")) < said.index((victim, "down"))
        # Each also went to the victim itself, whom the overlay stops reaching: so a live one can refute it.
        assert {b["state"] for b, to in host.direct if to == [victim]} == {"suspect", "down"}
        assert all(host.peers.get(p).state == UP for p in ids if p != victim)  # type: ignore[union-attr]


async def test_an_indirect_probe_keeps_up_a_peer_only_this_node_cannot_reach(autojump_clock) -> None:
    async with running(4) as (net, ids, host, live):
        net.unreachable_from_here.add(ids[0])
        live._streams.clear()  # the kept stream went with the link
        await trio.sleep(60)
        assert host.peers.get(ids[0]).state == UP  # type: ignore[union-attr]
        assert not [b for _, b in host.rumours if b["peer"] == ids[0]]


async def test_each_period_probes_a_bounded_number_of_peers(autojump_clock) -> None:
    net = Net()
    ids = peer_ids(200)
    host = Host(net, ids)
    for p in ids:
        host.peers.seen(p)
    live = Liveness(host, CFG)
    probed: list[int] = []
    for _ in range(10):
        probed.append(len(live.due()))
    assert max(probed) == MAX_PROBES_PER_PERIOD
    # ... and in turn: 200 watched peers are all probed within 25 periods.
    seen: set[str] = set()
    for _ in range(len(ids) // MAX_PROBES_PER_PERIOD):
        seen.update(live.due())
    assert seen == set(ids)


def rumour_from(identity: Identity, peer: str, verdict: Verdict, inc: int) -> Inbound:
    frame = seal(identity, RUMOUR, {"peer": peer, "state": str(verdict), "inc": inc})
    return Inbound(open_envelope(frame), None, identity.peer_id, gossip=True)


async def test_a_node_refutes_a_rumour_about_itself_with_a_higher_incarnation(autojump_clock) -> None:
    host = Host(Net(), [])
    live = Liveness(host, CFG)
    other = Identity.generate()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live.run)
        await trio.sleep(0.1)
        before = live.incarnation
        await host.handlers.dispatch(rumour_from(other, host.peer_id, Verdict.SUSPECT, before))
        await trio.sleep(1)
        assert live.incarnation == before + 1
        assert {"peer": host.peer_id, "state": "alive", "inc": before + 1} in [b for _, b in host.rumours]
        nursery.cancel_scope.cancel()


async def test_only_a_peer_itself_can_say_it_is_alive(autojump_clock) -> None:
    import pytest

    from mesh.codec import WireError

    subject, liar = Identity.generate(), Identity.generate()
    host = Host(Net(), [subject.peer_id])
    live = Liveness(host, CFG)
    host.peers.seen(subject.peer_id)
    await trio.sleep(CFG.suspect_after_s + 1)  # not heard lately: rumours count
    await host.handlers.dispatch(rumour_from(liar, subject.peer_id, Verdict.DOWN, 0))
    assert host.peers.get(subject.peer_id).state == DOWN  # type: ignore[union-attr]
    with pytest.raises(WireError):
        await host.handlers.dispatch(rumour_from(liar, subject.peer_id, Verdict.ALIVE, 10**12))
    assert host.peers.get(subject.peer_id).state == DOWN  # type: ignore[union-attr]
    await host.handlers.dispatch(rumour_from(subject, subject.peer_id, Verdict.ALIVE, live.known[subject.peer_id] + 1))
    assert host.peers.get(subject.peer_id).state == UP  # type: ignore[union-attr]


async def test_a_rumour_never_overrides_what_this_node_heard_lately(autojump_clock) -> None:
    subject, reporter = Identity.generate(), Identity.generate()
    host = Host(Net(), [subject.peer_id])
    Liveness(host, CFG)
    host.peers.seen(subject.peer_id)
    await trio.sleep(CFG.suspect_after_s / 2)
    await host.handlers.dispatch(rumour_from(reporter, subject.peer_id, Verdict.SUSPECT, 0))
    await host.handlers.dispatch(rumour_from(reporter, subject.peer_id, Verdict.DOWN, 0))
    assert host.peers.get(subject.peer_id).state == UP  # type: ignore[union-attr]


async def test_a_suspicion_heard_on_gossip_ends_in_down_unless_refuted(autojump_clock) -> None:
    quiet, refuting, reporter = Identity.generate(), Identity.generate(), Identity.generate()
    host = Host(Net(), [])
    live = Liveness(host, CFG)
    for p in (quiet.peer_id, refuting.peer_id):
        host.peers.seen(p)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live.run)
        await trio.sleep(CFG.suspect_after_s + 1)
        for p in (quiet.peer_id, refuting.peer_id):
            await host.handlers.dispatch(rumour_from(reporter, p, Verdict.SUSPECT, 0))
            assert host.peers.get(p).state == SUSPECT  # type: ignore[union-attr]
        await host.handlers.dispatch(rumour_from(refuting, refuting.peer_id, Verdict.ALIVE, 1))
        await trio.sleep(live.suspicion_s + CFG.ping_interval_s)
        assert host.peers.get(quiet.peer_id).state == DOWN  # type: ignore[union-attr]
        assert host.peers.get(refuting.peer_id).state == UP  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


async def test_redials_of_an_unreachable_peer_back_off_to_the_cap(autojump_clock) -> None:
    net = Net()
    ids = peer_ids(1)
    host = Host(net, ids, redial_ok=False)
    host.peers.seen(ids[0])
    host.connected = set()
    net.dead.add(ids[0])
    live = Liveness(host, CFG)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live.run)
        await trio.sleep(300)
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in pairwise(host.redials)]
    assert not host.direct or all(to == ids for _, to in host.direct)
    low, high = live.backoff.low, live.backoff.high
    assert len(host.redials) >= 5
    # Doubling from ``low`` (±10 % jitter, rounded up to the probe period), capped at ``high``.
    assert gaps[0] < low * 1.1 + CFG.ping_interval_s + 0.01
    assert all(g <= high * 1.1 + CFG.ping_interval_s + 0.01 for g in gaps)
    assert gaps[-1] >= high * 0.9
    assert sorted(gaps[:4]) == gaps[:4]  # doubling at first
    # ... and the peer, dead, was declared so once, not over and over.
    assert [b["state"] for _, b in host.rumours if b["peer"] == ids[0]].count("down") <= 1


async def test_only_suspicions_still_standing_at_their_time_are_declared_dead(autojump_clock) -> None:
    a, b = peer_ids(2)
    net = Net()
    host = Host(net, [a, b])
    live = Liveness(host, CFG)
    for p in (a, b):
        host.peers.seen(p)
    net.dead.update((a, b))
    await trio.sleep(CFG.suspect_after_s + 1)
    for p in (a, b):
        await live.suspect(p)
    host.peers.seen(b)  # b spoke up meanwhile
    await trio.sleep(live.suspicion_s + 0.1)
    assert live.expire() == [a]
    assert live.expire() == []  # each death once
    assert [str(host.peers.get(p).state) for p in (a, b)] == ["down", "up"]  # type: ignore[union-attr]


async def test_a_peer_taken_for_dead_that_answers_is_told_so_it_can_refute(autojump_clock) -> None:
    async with running(3) as (_, ids, host, _live):
        host.peers.set_state(ids[0], DOWN)  # a rumour, say, while it was only slow
        await trio.sleep(3 * CFG.ping_interval_s)
        assert host.peers.get(ids[0]).state == UP  # type: ignore[union-attr]
        assert ({"peer": ids[0], "state": "down", "inc": 0}, [ids[0]]) in host.direct


async def test_a_rumour_about_a_peer_still_connected_is_checked_first(autojump_clock) -> None:
    reporter = Identity.generate()
    async with running(3) as (net, ids, host, live):
        slow, dead = ids[0], ids[1]
        net.dead.add(dead)  # its connection is still listed: closed but not yet noticed
        await trio.sleep(CFG.suspect_after_s + 1)
        for p in (slow, dead):
            await host.handlers.dispatch(rumour_from(reporter, p, Verdict.DOWN, 0))
        await wait_state(host, dead, DOWN, 3 * CFG.ping_interval_s + live.suspicion_s + 1)
        assert host.peers.get(slow).state == UP  # type: ignore[union-attr]


def test_a_ping_waits_longer_for_a_peer_whose_round_trips_are_long() -> None:
    host = Host(Net(), [])
    live = Liveness(host, CFG)
    host.peers.seen("fast", rtt_ms=5.0)
    host.peers.seen("slow", rtt_ms=1500.0)
    host.peers.seen("stuck", rtt_ms=60_000.0)
    assert live.timeout("fast") == CFG.ping_timeout_s
    assert live.timeout("slow") == 6.0
    assert live.timeout("stuck") == 4 * CFG.ping_timeout_s


async def test_only_a_node_back_in_its_mesh_announces_itself_alive(autojump_clock) -> None:
    """A first-time node is a stranger everywhere (a rumour about a stranger is dropped), so its
    alive announcements would only cost every node copies when a whole mesh starts; a node that
    was in the mesh before announces itself, so peers holding it down see it up at once."""
    for back in (False, True):
        net, ids = Net(), peer_ids(4)
        host = Host(net, ids)
        live = Liveness(host, CFG)
        live.announce_start = back
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.run)
            await trio.sleep(30)
            nursery.cancel_scope.cancel()
        own = [b for _, b in host.rumours if b["peer"] == host.peer_id and b["state"] == "alive"]
        assert bool(own) == back, (back, own)


async def test_first_contact_only_with_the_keep_set_and_other_members_cost_nothing(autojump_clock) -> None:
    """A node learns of 200 members, keeps 6 of them: only those are ever probed or aged."""
    net = Net()
    ids = peer_ids(200)
    host = Host(net, ids[:6])
    for p in ids[6:]:
        host.peers.add(p)
    live = Liveness(host, CFG)
    opened: set[str] = set()
    plain_open = host.open

    async def open_(peer: str, protocol: str, timeout: float) -> Any:
        opened.add(peer)
        return await plain_open(peer, protocol, timeout)

    host.open = open_  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(live.run)
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert opened == set(ids[:6])
    assert all(host.peers.get(p).state == UP for p in ids[:6])  # type: ignore[union-attr]
    assert all(host.peers.get(p).state != DOWN for p in ids[6:])  # type: ignore[union-attr]
