"""Catch-up sync: learning the jobs and ledgers a peer holds, in bounded pages.

A node asks a peer when it starts, when a presence or a message names a job it does not know,
and when a peer's presence says its ledger of a job could win fork choice over ours (heavier,
or as heavy and longer), or a result arrives from another branch. However many jobs a node
holds and however long their ledgers, every answer is a page well within the frame limit:

* ``{"after": ID}``: the signed JobSpec frames of the jobs whose ids sort after ``ID``, up to
  ``PAGE_BYTES`` (and ``PAGE_JOBS``), each job's ledger height, weight (its verified
  contributions, ``forkchoice.chain_weight``) and head, and ``more`` (the last id sent) while
  further pages remain;
* ``{"job": ID, "from": N}``: that job's ledger frames from round ``N + 1``, up to
  ``PAGE_BYTES`` but at least one, and ``more`` while further frames remain.

The asker fetches ledger pages only for jobs where the peer's ledger, as the peer describes
it, could win fork choice (``SyncedJob.may_win``: heavier, which may be shorter; as heavy and
longer; or the same on another head), never more frames than the job has rounds, and never
more than ``LEDGER_SYNC_BYTES`` of frames it does not hold already. What a page says is only a
reason to fetch: every frame is checked as its page arrives (``ledger.ChainCheck``), the first
that does not verify ends the fetch and penalises the peer, and fork choice compares what
verified before anything changes. A claim of a heavier ledger therefore costs this node one
page at most unless the claimant serves verifiable rounds. A sync that a peer's message sets
off is throttled per peer (one at a time, and one every ``TRIGGER_EVERY_S`` at most), so
naming unknown jobs cannot make a node sync in a loop.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import trio

from gpuflex.node.core.ledger import ChainCheck, LedgerClaim, LedgerError
from gpuflex.node.core.ledgerfile import ChainFrames
from gpuflex.node.core.messages import JOB, SYNC
from mesh.codec import Envelope, WireError, WireReason, open_envelope, seal
from mesh.messaging import Inbound, Rejected, SendError
from mesh.node import MeshNode

log = logging.getLogger("gpuflex.sync")
#: A sync page holds at most this many bytes of frames (a single larger frame goes alone) ...
PAGE_BYTES = 4 << 20
#: ... and at most this many jobs.
PAGE_JOBS = 64
#: Pages of jobs asked of one peer in one sync: PAGES x PAGE_JOBS jobs at most.
MAX_PAGES = 64
#: Bytes of a peer's ledger frames one catch-up holds (those this node does not hold already);
#: past it the fetch stops and what verified is offered. Every page is checked as it arrives.
LEDGER_SYNC_BYTES = 64 << 20
#: Ledger pages asked of one peer in one catch-up.
MAX_LEDGER_PAGES = 4096
#: One page may take this long to arrive.
PAGE_TIMEOUT_S = 20.0
#: A sync set off by a peer's message (an unknown job) is made at most this often per peer.
TRIGGER_EVERY_S = 10.0
#: Peers whose last sync is remembered for the throttle.
TRIGGER_MEMORY = 1024
MAX_ID = 64  # a job id is 16 hex digits; anything much longer is not one


class SyncedJob(Protocol):
    """What sync reads and offers of one job (``JobDriver``)."""

    @property
    def committed(self) -> int: ...

    @property
    def rounds(self) -> int: ...

    @property
    def weight(self) -> int: ...

    def head(self) -> str: ...

    def may_win(self, claim: LedgerClaim) -> bool: ...

    def job_frame(self) -> bytes: ...

    def ledger_frames(self) -> Sequence[bytes]: ...

    def chain_check(self, start: int = 0) -> ChainCheck: ...

    async def offer_ledger(self, frames: Sequence[bytes], peer: str, held: int = 0) -> bool:
        """Adopt ``frames`` if they win; the first ``held`` of them are this node's own."""
        ...


def job_page(jobs: Mapping[str, SyncedJob], after: str) -> dict[str, Any]:
    """The page of jobs whose ids sort after ``after``."""
    frames: list[bytes] = []
    heights: dict[str, int] = {}
    weights: dict[str, int] = {}
    heads: dict[str, str] = {}
    size = 0
    more: str | None = None
    for job_id in sorted(j for j in jobs if j > after):
        frame = jobs[job_id].job_frame()
        if frames and (size + len(frame) > PAGE_BYTES or len(frames) >= PAGE_JOBS):
            more = max(heights)
            break
        frames.append(frame)
        heights[job_id] = jobs[job_id].committed
        weights[job_id] = jobs[job_id].weight
        heads[job_id] = jobs[job_id].head()
        size += len(frame)
    return {"jobs": frames, "heights": heights, "weights": weights, "heads": heads, "more": more}


def ledger_page(job: SyncedJob, start: int) -> dict[str, Any]:
    """Ledger frames of ``job`` from index ``start``: read one at a time, only as far as the page
    goes (the frames are on disk, ``ledger.LedgerFrames``)."""
    ledger = job.ledger_frames()
    out: list[bytes] = []
    size = 0
    for i in range(start, len(ledger)):
        frame = ledger[i]
        if out and size + len(frame) > PAGE_BYTES:
            break
        out.append(frame)
        size += len(frame)
    return {"ledger": out, "more": start + len(out) < len(ledger)}


class CatchUp:
    """Both sides of sync for one node: answering pages, and asking a peer for its jobs."""

    def __init__(self, mesh: MeshNode, jobs: Mapping[str, SyncedJob], adopt: Callable[[Envelope], object]) -> None:
        self.mesh, self.jobs, self.adopt = mesh, jobs, adopt
        self._running: set[str] = set()
        self._last: OrderedDict[str, float] = OrderedDict()
        self._nursery: trio.Nursery | None = None

    def run_in(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    # -- the answering side ----------------------------------------------------------------------

    async def answer(self, msg: Inbound) -> dict[str, Any]:
        body = msg.envelope.body if isinstance(msg.envelope.body, dict) else {}
        job_id, start = body.get("job"), body.get("from", 0)
        if job_id is None:
            after = body.get("after", "")
            if not isinstance(after, str) or len(after) > MAX_ID:
                raise WireError(WireReason.GARBLED, "sync request with a bad cursor")
            return job_page(self.jobs, after)
        if not isinstance(job_id, str) or not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise WireError(WireReason.GARBLED, "ledger sync request with a bad job or start")
        job = self.jobs.get(job_id)
        if job is None:
            raise Rejected(f"unknown job {job_id[:MAX_ID]!r}")
        return ledger_page(job, start)

    # -- the asking side -------------------------------------------------------------------------

    def trigger(self, peer: str) -> None:
        """Sync from ``peer`` in the background, unless one ran or runs too recently."""
        now = time.monotonic()
        if peer == self.mesh.peer_id or peer in self._running or now - self._last.get(peer, -1e18) < TRIGGER_EVERY_S:
            return
        self._last.pop(peer, None)
        self._last[peer] = now
        while len(self._last) > TRIGGER_MEMORY:
            self._last.popitem(last=False)
        if self._nursery is not None:
            self._nursery.start_soon(self.sync_from_peer, peer)

    async def _ask(self, peer: str, body: dict[str, Any]) -> dict[str, Any] | None:
        try:
            reply = await self.mesh.request(peer, seal(self.mesh.identity, SYNC, body), timeout=PAGE_TIMEOUT_S)
        except SendError as exc:
            log.info("sync from %s failed: %s", peer[-8:], exc)
            return None
        return reply if isinstance(reply, dict) else None

    async def sync_from_peer(self, peer: str) -> bool:
        """Learn ``peer``'s jobs, page by page, and its ledger of every job where that ledger
        could win fork choice over ours (heavier, even if shorter)."""
        if peer in self._running:
            return False
        self._running.add(peer)
        try:
            claims = await self._learn_jobs(peer)
            if claims is None:
                return False
            for job_id, claim in claims.items():
                job = self.jobs.get(job_id)
                if job is not None and job.may_win(claim):
                    await self._catch_up(peer, job_id, job)
            return True
        finally:
            self._running.discard(peer)

    async def sync_job(self, peer: str, job_id: str) -> bool:
        """Fetch ``peer``'s ledger of ``job_id`` (its presence says it may win here) and offer
        it; True only if the job adopted it (a claim that changed nothing is fruitless)."""
        job = self.jobs.get(job_id)
        if job is None or peer in self._running:
            return False
        self._running.add(peer)
        try:
            return await self._catch_up(peer, job_id, job)
        finally:
            self._running.discard(peer)

    async def _learn_jobs(self, peer: str) -> dict[str, LedgerClaim] | None:
        """Every job ``peer`` names, adopted where this node takes it on, and per job what the
        peer says of its ledger, typed but unverified (``may_win`` judges it)."""
        claims: dict[str, LedgerClaim] = {}
        after = ""
        for _ in range(MAX_PAGES):
            reply = await self._ask(peer, {"after": after})
            if reply is None:
                return claims or None
            frames = reply.get("jobs")
            for frame in (frames if isinstance(frames, list) else [])[:PAGE_JOBS]:
                try:
                    self.adopt(open_envelope(frame, expect_kind=JOB))
                except (WireError, Rejected) as exc:
                    log.info("ignored job from sync: %s", exc)
            page, weights, heads = (reply.get(k) for k in ("heights", "weights", "heads"))
            weights = weights if isinstance(weights, dict) else {}
            heads = heads if isinstance(heads, dict) else {}
            for job_id, height in (page.items() if isinstance(page, dict) else ()):
                if isinstance(job_id, str) and len(claims) < MAX_PAGES * PAGE_JOBS:
                    claims[job_id] = LedgerClaim.from_wire(height, weights.get(job_id), heads.get(job_id))
            more = reply.get("more")
            if not isinstance(more, str) or more <= after or len(more) > MAX_ID:
                break
            after = more
        return claims

    async def _catch_up(self, peer: str, job_id: str, job: SyncedJob) -> bool:
        """Fetch ``peer``'s ledger of ``job`` in pages, checking each frame as it arrives
        (``ChainCheck``), and offer what verified to the job. A frame that does not verify ends
        the fetch and penalises the peer; so does the ``LEDGER_SYNC_BYTES`` budget of frames
        this node did not hold already (what verified so far is still offered: a long honest
        ledger is taken in instalments, one sync after another).

        The fetch first resumes after the rounds this node holds: a node a round behind on the
        same branch, the common case, fetches that one round, not the whole ledger (every round's
        result names each contributor's signed update, so at a thousand members a ledger of r
        rounds is r MB, and nodes a round behind fetched it all every round). Only when the
        peer's ledger does not extend ours there (a fork, or a heavier but shorter branch) is
        it fetched from round 1."""
        held = min(len(job.ledger_frames()), job.rounds)
        for resume in ((held, 0) if held else (0,)):
            frames = await self._fetch(peer, job_id, job, resume)
            if frames is not None:  # offered only with something fetched beyond what resumed
                return len(frames) > resume and await job.offer_ledger(frames, peer, resume)
        return False

    async def _fetch(self, peer: str, job_id: str, job: SyncedJob, resume: int) -> ChainFrames | None:
        """This node's first ``resume`` frames (a view of its file, not read) and the verified
        frames of ``peer``'s ledger after them; None when, resuming after a round of ours, the
        peer's ledger has no round there that extends ours."""
        check = job.chain_check(resume)
        got: list[bytes] = []
        frames = ChainFrames(job.ledger_frames(), resume, got)
        for _ in range(MAX_LEDGER_PAGES):
            if len(frames) >= job.rounds or check.held >= LEDGER_SYNC_BYTES:
                break
            reply = await self._ask(peer, {"job": job_id, "from": len(frames)})
            page = reply.get("ledger") if reply is not None else None
            if not isinstance(page, list) or not page or not all(isinstance(f, bytes) for f in page):
                if resume and len(frames) == resume:
                    return None
                break
            if resume and len(frames) == resume and not check.links(page[0]):
                return None
            try:
                for frame in page[: job.rounds - len(frames)]:
                    got.append(check.extend(frame))
            except LedgerError as exc:
                self.mesh.inbound.reject(peer, WireError(WireReason.EVIDENCE, f"ledger from {peer[-8:]}: {exc}"),
                                         f"sync page of job {job_id}")
                break
            if not reply or not reply.get("more"):
                break
        if check.held >= LEDGER_SYNC_BYTES:
            log.info("sync of job %s from %s: stopped at round %d, the %d MiB budget of new ledger frames",
                     job_id, peer[-8:], len(frames), LEDGER_SYNC_BYTES >> 20)
        return frames
