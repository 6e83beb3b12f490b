"""Catch-up sync (gpuflex.node.sync): however many jobs and rounds a node holds, every answer
is a bounded page, and paging from the start yields each job and frame exactly once; the asker
fetches a peer's ledger where, as the page describes it, it could win fork choice (heavier,
even if shorter), and not where it is lighter, however long."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from gpuflex.node import sync
from gpuflex.node.ledger import HEAD_CHARS, Ledger
from gpuflex.node.sync import CatchUp, job_page, ledger_page
from mesh.codec import open_envelope
from mesh.identity import Identity
from mesh.messaging import Inbound
from mesh.node import MeshNode
from tests.unit.node.chain import JOB, make_chain, private_branch, rules_for


@dataclass
class FakeJob:
    frame: bytes
    ledger: list[bytes] = field(default_factory=list)

    @property
    def committed(self) -> int:
        return len(self.ledger)

    @property
    def rounds(self) -> int:
        return 100

    @property
    def weight(self) -> int:
        return 2 * len(self.ledger)

    def head(self) -> str:
        return "0" * 16

    def may_win(self, height: object, weight: object = None, head: object = None) -> bool:
        raise AssertionError("not asked in these tests")

    def job_frame(self) -> bytes:
        return self.frame

    def ledger_frames(self) -> list[bytes]:
        return self.ledger

    async def offer_ledger(self, frames: list[bytes], peer: str) -> None:
        raise AssertionError("not offered in these tests")


def test_seventy_jobs_of_300_kib_come_in_pages_under_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = {f"{i:016x}": FakeJob(bytes(300 << 10), [b"r"] * i) for i in range(70)}
    seen: dict[str, int] = {}
    after, pages = "", 0
    while True:
        page = job_page(jobs, after)
        pages += 1
        assert sum(map(len, page["jobs"])) <= sync.PAGE_BYTES and len(page["jobs"]) <= sync.PAGE_JOBS
        assert len(page["jobs"]) == len(page["heights"]) == len(page["weights"]) == len(page["heads"])
        for job_id, height in page["heights"].items():
            assert job_id not in seen
            seen[job_id] = height
        if page["more"] is None:
            break
        after = page["more"]
    assert seen == {j: job.committed for j, job in jobs.items()}
    assert pages == 6  # 13 frames of 300 KiB fit in 4 MiB


def test_a_frame_larger_than_a_page_still_goes_alone() -> None:
    jobs = {"a": FakeJob(bytes(sync.PAGE_BYTES + 1)), "b": FakeJob(b"x")}
    assert job_page(jobs, "")["heights"] == {"a": 0} and job_page(jobs, "")["more"] == "a"
    assert job_page(jobs, "a") == {"jobs": [b"x"], "heights": {"b": 0}, "weights": {"b": 0},
                                   "heads": {"b": "0" * 16}, "more": None}


def test_ledger_pages_cover_every_round_once() -> None:
    frames = [bytes([i]) * (1 << 20) for i in range(10)]
    job = FakeJob(b"", frames)
    got: list[bytes] = []
    while True:
        page = ledger_page(job, len(got))
        assert page["ledger"] and sum(map(len, page["ledger"])) <= sync.PAGE_BYTES
        got += page["ledger"]
        if not page["more"]:
            break
    assert got == frames
    assert ledger_page(job, 10) == {"ledger": [], "more": False}


@dataclass
class LedgerJob:
    """A job as sync sees it, holding a real verified ledger; records the ledgers offered to it."""

    ledger: Ledger
    offered: list[list[bytes]] = field(default_factory=list)

    @property
    def committed(self) -> int:
        return len(self.ledger)

    @property
    def rounds(self) -> int:
        return 10

    @property
    def weight(self) -> int:
        return self.ledger.weight

    def head(self) -> str:
        return self.ledger.head[:HEAD_CHARS]

    def may_win(self, height: object, weight: object = None, head: object = None) -> bool:
        return self.ledger.may_win(height, weight, head)

    def job_frame(self) -> bytes:
        return b"not a job frame"  # the asker already holds the job

    def ledger_frames(self) -> list[bytes]:
        return self.ledger.frames

    async def offer_ledger(self, frames: list[bytes], peer: str) -> bool:
        self.offered.append(frames)
        return True


class Wire:
    """The asker's side of the mesh: each request goes straight to the peer's answering side."""

    def __init__(self, identity: Identity, peer: CatchUp) -> None:
        self.identity, self.peer, self.asked = identity, peer, []

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    async def request(self, peer: str, frame: bytes, payload: bytes | None = None, timeout: float = 30.0) -> Any:
        env = open_envelope(frame)
        self.asked.append(env.body)
        return await self.peer.answer(Inbound(env, None, self.peer_id, gossip=False))


def ledger_of(tmp: Path, frames: list[bytes], ids: list[Identity]) -> LedgerJob:
    ledger = Ledger(tmp / f"{len(frames)}.msgpack", JOB, rules_for(ids))
    ledger.replace(frames)
    return LedgerJob(ledger)


async def test_a_heavier_shorter_ledger_is_fetched_and_a_lighter_longer_one_is_not(tmp_path: Path) -> None:
    honest, ids = make_chain(rounds=4, members=4)  # 4 rounds of 4 contributions: weight 16
    sybil = private_branch(honest, ids, ids[2:], upto=6)  # 6 rounds, two keys' own: weight 14
    for ours, theirs, fetched in ((sybil, honest, True), (honest, sybil, False)):
        asker = ledger_of(tmp_path, ours, ids)
        wire = Wire(ids[0], CatchUp(cast(MeshNode, None), {JOB: ledger_of(tmp_path, theirs, ids)}, lambda env: None))
        assert await CatchUp(cast(MeshNode, wire), {JOB: asker}, lambda env: None).sync_from_peer(ids[1].peer_id)
        assert asker.offered == ([theirs] if fetched else [])
        assert any("job" in body for body in wire.asked) == fetched  # a lighter ledger is not even asked for
