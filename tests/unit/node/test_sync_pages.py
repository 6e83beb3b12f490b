"""Catch-up sync pages (gpuflex.node.sync): however many jobs and rounds a node holds, every
answer is a bounded page, and paging from the start yields each job and frame exactly once."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpuflex.node import sync
from gpuflex.node.sync import job_page, ledger_page


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
        assert len(page["jobs"]) == len(page["heights"])
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
    assert job_page(jobs, "a") == {"jobs": [b"x"], "heights": {"b": 0}, "more": None}


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
