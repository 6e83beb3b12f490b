"""Presence goes to each job's members only (gpuflex.node.jobs.JobManager.send_presence).

The mesh node is real but not started, with its one send verb recorded; the jobs are
stand-ins that say who their members are, so only the presence fan-out is under test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuflex.node.core.kinds import JobState
from gpuflex.node.core.messages import PRESENCE
from gpuflex.node.events import EventLog
from gpuflex.node.jobs import JobManager
from mesh.codec import open_envelope
from mesh.identity import Identity
from mesh.node import MeshConfig, MeshNode


class StandInJob:
    """What presence reads of a job driver."""

    def __init__(self, members: set[str]) -> None:
        self.members = members
        self.state = JobState.RUNNING
        self.committed = 3
        self.weight = 7
        self.preparing = False
        self.passes_round = 0
        self.failure = ""  # why the job failed here (JobDriver.failure); it has not
        self.seen: list[str] = []

    def participates(self) -> bool:
        return True

    def throughput(self) -> float:
        return 1.5

    def head(self) -> str:
        return "ab" * 8

    def known_members(self) -> set[str]:
        return set(self.members)

    def saw_presence(self, peer: str, *args: Any, **kwargs: Any) -> bool:
        self.seen.append(peer)
        return False


def manager(tmp_path: Path, up: list[str]) -> tuple[JobManager, list[tuple[list[str], dict[str, Any]]]]:
    mesh = MeshNode(Identity.generate(), MeshConfig(data_dir=tmp_path / "mesh", mdns=False))
    for peer in up:
        mesh.peers.seen(peer)
    sent: list[tuple[list[str], dict[str, Any]]] = []

    async def send_direct(frame: bytes, peers: list[str]) -> int:
        env = open_envelope(frame, expect_kind=PRESENCE)
        assert env.sender == mesh.peer_id
        sent.append((sorted(peers), env.body))
        return len(peers)

    mesh.send_direct = send_direct  # type: ignore[method-assign]
    return JobManager(mesh, EventLog(), tmp_path / "home"), sent


def ids(n: int) -> list[str]:
    return [Identity.generate().peer_id for _ in range(n)]


async def test_a_node_in_no_job_sends_no_presence(tmp_path: Path) -> None:
    jobs, sent = manager(tmp_path, ids(5))
    await jobs.send_presence()
    assert sent == []


async def test_each_peer_hears_only_of_the_jobs_it_is_in(tmp_path: Path) -> None:
    p1, p2, p3, p4, gone = ids(5)
    jobs, sent = manager(tmp_path, [p1, p2, p3, p4])
    a, b = StandInJob({p1, p2, gone}), StandInJob({p2, p3})
    jobs.drivers.update({"job-a": a, "job-b": b})  # type: ignore[dict-item]
    await jobs.send_presence()
    heard = {peer: sorted(body["jobs"]) for peers, body in sent for peer in peers}
    assert heard == {p1: ["job-a"], p2: ["job-a", "job-b"], p3: ["job-b"]}  # p4 is in neither; gone is down
    assert a.seen == b.seen == [jobs.mesh.peer_id]  # applied here first, as a broadcast was


async def test_no_presence_grows_with_the_jobs_on_the_mesh(tmp_path: Path) -> None:
    peers = ids(200)
    jobs, sent = manager(tmp_path, peers)
    for i, peer in enumerate(peers):  # 200 jobs, each shared with one peer
        jobs.drivers[f"job-{i:03d}"] = StandInJob({peer})  # type: ignore[assignment]
    await jobs.send_presence()
    assert len(sent) == 200
    assert max(len(body["jobs"]) for _, body in sent) == 1


class _Round:
    def __init__(self, round_: int, plan: Any) -> None:
        self.round, self.plan = round_, plan


class _Book:
    """What ``recipients`` reads of a job's round state: the next coordinators and the plan."""

    def __init__(self, coordinators: list[str], plan: Any = None) -> None:
        self.coordinators, self.current = coordinators, _Round(4, plan)
        self.asked = 0

    def coordinator_order(self) -> list[str]:
        self.asked += 1
        return list(self.coordinators)


class _Port:
    """What ``recipients`` reads of the job's port: who is behind NAT, whose record is held
    (``health`` is None for a peer with none)."""

    def __init__(self, homes: set[str] | None = None, recorded: set[str] | None = None) -> None:
        self.homes, self.recorded = homes or set(), recorded

    def behind_nat(self, peer: str) -> bool:
        return peer in self.homes

    def health(self, peer: str) -> Any:
        from mesh.health import PeerState

        return PeerState.UP if self.recorded is None or peer in self.recorded else None


class _Driver:
    def __init__(self, book: _Book, known: set[str] | None = None, port: _Port | None = None) -> None:
        self.book, self.known, self.port = book, known or set(), port or _Port()

    def known_members(self) -> set[str]:
        return set(self.known)


def test_presence_in_a_large_job_goes_to_a_bounded_few_members() -> None:
    from types import SimpleNamespace

    from gpuflex.node.presence import (
        PRESENCE_COORDINATORS,
        PRESENCE_SPREAD,
        PRESENCE_TO_ALL,
        recipients,
    )

    members = {Identity.generate().peer_id for _ in range(300)}
    me, parent, child, *others = sorted(members)
    book = _Book(others[:PRESENCE_COORDINATORS], SimpleNamespace(parent={me: parent, child: me, parent: None}))
    cache: dict[str, Any] = {}
    out = recipients(me, members, _Driver(book), cache)
    assert len(out) <= PRESENCE_SPREAD + PRESENCE_COORDINATORS + 2
    assert set(others[:PRESENCE_COORDINATORS]) | {parent, child} <= out and me not in out
    asked = book.asked
    assert recipients(me, members, _Driver(book), cache) == out and book.asked == asked  # ranked once a round
    small = set(sorted(members)[:PRESENCE_TO_ALL])
    assert recipients(me, small, _Driver(book), {}) == small - {me}


def test_presence_also_goes_to_the_first_reachable_coordinators_past_the_homes() -> None:
    """With most members at home, a round's plan comes from the first reachable candidate,
    attempts past the first few: presence goes there too (with its reachability), or that
    coordinator plans blind and takes homes for reachable leaders."""
    from gpuflex.node.presence import PRESENCE_COORDINATOR_SCAN, PRESENCE_COORDINATORS, next_coordinators, recipients

    members = {Identity.generate().peer_id for _ in range(300)}
    me, *others = sorted(members)
    order = others[:PRESENCE_COORDINATOR_SCAN + 5]
    homes = set(order[:20]) | set(order[22:30])
    reachable_first = [p for p in order[:PRESENCE_COORDINATOR_SCAN] if p not in homes][:PRESENCE_COORDINATORS]
    assert reachable_first == [order[20], order[21], order[30]]
    out = recipients(me, members, _Driver(_Book(order), port=_Port(homes)), {})
    assert set(order[:PRESENCE_COORDINATORS]) | set(reachable_first) <= out
    assert order[31] not in next_coordinators(order, homes.__contains__)
    # None reachable within the scan: the first attempts' candidates only.
    assert next_coordinators(order, lambda p: True) == set(order[:PRESENCE_COORDINATORS])


def test_presence_goes_to_the_next_coordinators_this_node_keeps_no_record_of() -> None:
    """A large mesh's peer table holds a bounded few records: a next coordinator this node
    has no record of is not among the members it has up, yet its presence must reach it, or
    that coordinator never plans this node again once it sat a round out. One it holds a
    record of and does not have up (down, ignored) is not sent to."""
    from gpuflex.node.presence import PRESENCE_COORDINATORS, recipients

    members = {Identity.generate().peer_id for _ in range(300)}
    me, *others = sorted(members)
    order = others[:8]
    unrecorded, down = order[0], order[1]
    up = members - {unrecorded, down}
    port = _Port(recorded=members - {unrecorded})
    out = recipients(me, up, _Driver(_Book(order), known=members, port=port), {})
    assert unrecorded in out and down not in out
    assert set(order[2:PRESENCE_COORDINATORS]) <= out
    # Not a member of the job (no presence of it, not in the ledger): not sent to.
    assert unrecorded not in recipients(me, up, _Driver(_Book(order), known=members - {unrecorded}, port=port), {})
