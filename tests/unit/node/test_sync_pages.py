"""Catch-up sync (gpuflex.node.sync): however many jobs and rounds a node holds, every answer
is a bounded page, and paging from the start yields each job and frame exactly once; the asker
fetches a peer's ledger where, as the page describes it, it could win fork choice (heavier,
even if shorter), and not where it is lighter, however long."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from gpuflex.node import sync
from gpuflex.node.core.ledger import HEAD_CHARS, ChainCheck, Ledger, LedgerClaim
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

    def may_win(self, claim: LedgerClaim) -> bool:
        raise AssertionError("not asked in these tests")

    def job_frame(self) -> bytes:
        return self.frame

    def ledger_frames(self) -> list[bytes]:
        return self.ledger

    async def offer_ledger(self, frames: Sequence[bytes], peer: str, held: int = 0) -> None:
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
    offered: list[Sequence[bytes]] = field(default_factory=list)
    served: list[bytes] | None = None  # frames to serve instead of the ledger's (a hostile peer)

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

    def may_win(self, claim: LedgerClaim) -> bool:
        return self.ledger.may_win(claim)

    def job_frame(self) -> bytes:
        return b"not a job frame"  # the asker already holds the job

    def ledger_frames(self) -> Sequence[bytes]:
        return self.ledger.frames if self.served is None else self.served

    async def offer_ledger(self, frames: Sequence[bytes], peer: str, held: int = 0) -> bool:
        self.offered.append(frames)
        return True

    def chain_check(self, start: int = 0) -> ChainCheck:
        return ChainCheck(self.ledger, start)


class Rejections:
    """The mesh's ``inbound.reject``: who was penalised, for what."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def reject(self, peer: str, exc: Exception, what: str) -> None:
        self.seen.append((peer, str(exc)))


class Wire:
    """The asker's side of the mesh: each request goes straight to the peer's answering side."""

    def __init__(self, identity: Identity, peer: CatchUp) -> None:
        self.identity, self.peer, self.asked = identity, peer, []
        self.inbound = Rejections()

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


class Bomb:
    """A peer that claims a heavier ledger and answers every ledger page with ``frame`` (and
    more to come), as long as it is asked."""

    def __init__(self, frame: bytes, pages: int = 50) -> None:
        self.frame, self.pages, self.asked = frame, pages, 0

    async def answer(self, msg: Inbound) -> dict[str, Any]:
        body = msg.envelope.body
        if "job" not in body:
            return {"jobs": [], "heights": {JOB: 10}, "weights": {JOB: 10**6}, "more": None}
        self.asked += 1
        return {"ledger": [self.frame], "more": self.asked < self.pages}


async def test_a_page_that_does_not_verify_ends_the_fetch_and_penalises_the_peer(tmp_path: Path) -> None:
    honest, ids = make_chain(rounds=2, members=3)
    asker = ledger_of(tmp_path, honest[:1], ids)
    bomb = Bomb(bytes(1 << 20))  # a megabyte of zeros a page: no frame at all
    wire = Wire(ids[0], cast(CatchUp, bomb))
    assert await CatchUp(cast(MeshNode, wire), {JOB: asker}, lambda env: None).sync_from_peer(ids[1].peer_id)
    assert bomb.asked == 1 and asker.offered == []
    assert [peer for peer, _ in wire.inbound.seen] == [ids[1].peer_id]


async def test_a_forged_round_after_honest_ones_stops_there_and_the_verified_rounds_are_offered(
        tmp_path: Path) -> None:
    honest, ids = make_chain(rounds=3, members=3)
    forged = make_chain(rounds=4, members=3)[0][3]  # round 4 of another chain: its link is broken
    asker = ledger_of(tmp_path, honest[:1], ids)
    served = ledger_of(tmp_path, honest, ids)
    served.served = [*honest, forged]  # what it serves; never verified on its side
    peer = CatchUp(cast(MeshNode, None), {JOB: served}, lambda env: None)
    wire = Wire(ids[0], peer)
    await CatchUp(cast(MeshNode, wire), {JOB: asker}, lambda env: None).sync_from_peer(ids[1].peer_id)
    assert asker.offered == [honest]
    assert len(wire.inbound.seen) == 1 and "round 4" in wire.inbound.seen[0][1]


async def test_new_ledger_bytes_are_capped_and_frames_we_hold_cost_nothing(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    honest, ids = make_chain(rounds=8, members=3)
    size = len(honest[0])
    monkeypatch.setattr(sync, "PAGE_BYTES", 1)  # a frame a page
    monkeypatch.setattr(sync, "LEDGER_SYNC_BYTES", 3 * size)
    asker = ledger_of(tmp_path, honest[:4], ids)  # holds 4 rounds: those are free
    peer = CatchUp(cast(MeshNode, None), {JOB: ledger_of(tmp_path, honest, ids)}, lambda env: None)
    wire = Wire(ids[0], peer)
    await CatchUp(cast(MeshNode, wire), {JOB: asker}, lambda env: None).sync_from_peer(ids[1].peer_id)
    # 4 rounds it held, then new rounds until the budget of 3 frames' bytes is reached
    [offered] = asker.offered
    assert 4 + 2 <= len(offered) < 8 and offered == honest[: len(offered)]
    assert offered[:4] == asker.ledger.frames  # the rounds it held, read back from its own file
    assert not wire.inbound.seen


def ledger_asks(wire: Wire) -> list[int]:
    """Where each ledger page the asker asked for started."""
    return [body["from"] for body in wire.asked if "job" in body]


async def test_a_node_rounds_behind_on_the_same_branch_fetches_only_the_rounds_it_lacks(tmp_path: Path) -> None:
    honest, ids = make_chain(rounds=6, members=3)
    asker = ledger_of(tmp_path, honest[:4], ids)
    wire = Wire(ids[0], CatchUp(cast(MeshNode, None), {JOB: ledger_of(tmp_path, honest, ids)}, lambda env: None))
    assert await CatchUp(cast(MeshNode, wire), {JOB: asker}, lambda env: None).sync_from_peer(ids[1].peer_id)
    assert ledger_asks(wire) == [4]  # one page, from round 5: rounds 1-4 never cross the wire again
    assert asker.offered == [honest] and not wire.inbound.seen


async def test_a_ledger_forked_before_our_head_is_fetched_from_round_one_without_a_penalty(tmp_path: Path) -> None:
    honest, ids = make_chain(rounds=4, members=4)
    ours = private_branch(honest, ids, ids[2:], upto=3)  # forked after round 1, lighter and shorter
    asker = ledger_of(tmp_path, ours, ids)
    wire = Wire(ids[0], CatchUp(cast(MeshNode, None), {JOB: ledger_of(tmp_path, honest, ids)}, lambda env: None))
    assert await CatchUp(cast(MeshNode, wire), {JOB: asker}, lambda env: None).sync_from_peer(ids[1].peer_id)
    assert ledger_asks(wire) == [3, 0]  # round 4 does not extend our round 3: from round 1 again
    assert asker.offered == [honest] and not wire.inbound.seen


class CountedReads(Sequence[bytes]):
    """A ledger's frames that count how many of them were read."""

    def __init__(self, frames: Sequence[bytes]) -> None:
        self.frames, self.reads = frames, 0

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, index: Any) -> Any:
        got = self.frames[index]
        self.reads += len(got) if isinstance(index, slice) else 1
        return got


async def test_a_node_a_round_behind_fetches_that_round_and_reads_none_of_its_own(tmp_path: Path) -> None:
    honest, ids = make_chain(rounds=7, members=3)
    asker = ledger_of(tmp_path, honest[:6], ids)
    ours = asker.served = CountedReads(asker.ledger.frames)  # type: ignore[assignment]
    peer = CatchUp(cast(MeshNode, None), {JOB: ledger_of(tmp_path, honest, ids)}, lambda env: None)
    wire = Wire(ids[0], peer)
    assert await CatchUp(cast(MeshNode, wire), {JOB: asker}, lambda env: None).sync_from_peer(ids[1].peer_id)
    assert ledger_asks(wire) == [6]  # resumed after the six rounds it holds
    assert ours.reads == 0  # ... without reading them back from its file
    assert asker.offered == [honest]  # what it offers still reads as the whole chain
