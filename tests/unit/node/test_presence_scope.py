"""Presence goes to each job's members only (gpuflex.node.jobs.JobManager.send_presence).

The mesh node is real but not started, with its one send verb recorded; the jobs are
stand-ins that say who their members are, so only the presence fan-out is under test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuflex.node.events import EventLog
from gpuflex.node.jobs import JobManager
from gpuflex.node.kinds import JobState
from gpuflex.node.messages import PRESENCE
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

    def expected_coordinator(self, attempt: int) -> str | None:
        self.asked += 1
        return self.coordinators[attempt]


class _Driver:
    def __init__(self, book: _Book) -> None:
        self.book = book


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
