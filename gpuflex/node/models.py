"""The models a job holds on this node: fetched by hash (a round's new one down the round's
tree, ``downtree``), rebuilt from a committed step where the root sent one, and pruned to the
last few as rounds commit."""

from __future__ import annotations

import logging

import numpy as np
import trio

from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.messages import Result
from gpuflex.node.core.modelblob import model_blob_limit, model_parts, unpack_model
from gpuflex.node.core.outerstep import replay_step
from gpuflex.node.core.selection import best_result
from gpuflex.node.downtree import down_chain, fetch_down
from gpuflex.node.port import FETCH_TIMEOUT_S, JobPort
from gpuflex.node.state import JobBook
from mesh.blob import BlobError, parts_hash
from mesh.codec import WireError

log = logging.getLogger("gpuflex.models")
#: Committed models (and their steps) a node keeps: the head, and the one before it, which a
#: ledger restored from its backup copy would return to. Older ones are deleted, or a long job
#: would fill the disk with a model per round.
MODELS_KEPT = 2
#: A committed step is a quarter of the model or less: if it takes longer than this, download
#: the model instead.
STEP_FETCH_S = 60.0
#: A model fetch waits this long for the job's model to be built here (its size is the limit).
SIZE_WAIT_S = 300.0


class Models:
    def __init__(self, port: JobPort, book: JobBook) -> None:
        self.port, self.book = port, book
        self._best_kept = ""  # the best model kept beyond the window at the last prune

    async def blob_limit(self) -> int:
        """The most a model or step blob of this job may announce (``model_blob_limit``): known
        once this node has built the job's model (preparing it), which a fetch waits for. A
        peer's announced size is checked against it before any disk is reserved."""
        book = self.book
        with trio.move_on_after(SIZE_WAIT_S):
            await book.sized.wait()
        if not book.sized.is_set():
            raise BlobError(f"job {book.job_id}: its model is not built here yet, so no model blob is fetched "
                            "(its size bounds what a peer may send)")
        return model_blob_limit(book.model_size)

    async def load(self, digest: str, providers: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The model blob ``digest``, re-fetched from peers if the local copy fails its hash."""
        port = self.port
        if not port.blobs.has(digest):
            await port.fetch_blob(digest, providers, max_size=await self.blob_limit())
        try:
            data = port.blobs.read(digest, verify=True)
        except BlobError as exc:
            port.emit(EventKind.STATE_CORRUPT, message=f"{exc}; fetching it again from peers")
            await port.fetch_blob(digest, providers or port.heard_peers(), max_size=await self.blob_limit())
            data = port.blobs.read(digest, verify=True)
        return unpack_model(data)

    async def hold_committed(self, res: Result) -> None:
        """Hold the model a result commits: rebuilt from the previous model and the encoded
        step where the root sent one, else (or if the rebuild does not match) downloaded. Both
        come down the round's tree (``downtree``): from this node's parent first, the root
        last, so the root serves its own children only."""
        blobs = self.port.blobs
        chain = down_chain(res, self.book.me)
        if res.step_hash is not None and not blobs.has(res.model_hash) and blobs.has(res.base_hash):
            try:
                await fetch_down(self.port, res.step_hash, chain, timeout=STEP_FETCH_S,
                                 max_size=await self.blob_limit())
                parts = await self.port.offload(self._replay, res)
                if parts_hash(parts) == res.model_hash:
                    blobs.put_parts(parts)
                    self.book.status.replayed_step()
                else:
                    log.warning("round %d: the model rebuilt from the step does not match %s; "
                                "downloading it", res.round, res.model_hash[:12])
            except (BlobError, WireError) as exc:
                log.info("round %d: rebuilding from the step failed (%s); downloading the model",
                         res.round, exc)
        if not blobs.has(res.model_hash):
            try:
                await fetch_down(self.port, res.model_hash, chain, timeout=FETCH_TIMEOUT_S,
                                 max_size=await self.blob_limit())
            except BlobError as exc:  # ``load`` asks them all once more, and then the mesh
                log.info("round %d: the model did not come down the tree (%s)", res.round, exc)
        await self.load(res.model_hash, chain)

    async def hold_head(self, results: list[Result], providers: list[str]) -> None:
        """Hold the model the last of ``results`` (a verified chain) commits. A node that is a
        few rounds behind replays the steps it missed from the newest model it holds, as long
        as their bytes stay below the model's; otherwise (or if a step fails) it downloads
        the model."""
        blobs = self.port.blobs
        head = results[-1]
        start = next((i for i in range(len(results) - 1, -1, -1) if blobs.has(results[i].base_hash)), None)
        if not blobs.has(head.model_hash) and start is not None and all(x.step_hash for x in results[start:]):
            budget, fetched = blobs.size(results[start].base_hash), 0
            try:
                for res in results[start:]:
                    assert res.step_hash is not None
                    await self.port.fetch_blob(res.step_hash, [*providers, res.coordinator], timeout=STEP_FETCH_S)
                    fetched += blobs.size(res.step_hash)
                    if fetched >= budget:
                        log.info("round %d: the missed steps cost more than the model; downloading it", res.round)
                        break
                    parts = await self.port.offload(self._replay, res)
                    if parts_hash(parts) != res.model_hash:
                        log.warning("round %d: the model rebuilt from the step does not match %s; "
                                    "downloading the head model", res.round, res.model_hash[:12])
                        break
                    blobs.put_parts(parts)
                    self.book.status.replayed_step()
            except (BlobError, WireError, OSError) as exc:
                log.info("replaying missed steps failed (%s); downloading the model", exc)
            self._discard_replayed(results[start:-1])
        await self.load(head.model_hash, providers)

    def _discard_replayed(self, passed: list[Result]) -> None:
        """The models (and steps) a catch-up replay went through and no longer needs."""
        keep = {x.model_hash for x in self.book.ledger.results[-MODELS_KEPT:]} | self.port.blobs_in_use()
        for x in passed[:-1]:
            for digest in {x.model_hash, x.step_hash or ""} - keep - {""}:
                try:
                    self.port.blobs.discard(digest)
                except OSError as exc:
                    log.warning("could not delete a replayed model %s: %s", digest[:12], exc)

    def _replay(self, res: Result) -> list[memoryview]:
        assert res.step_hash is not None
        params, state = unpack_model(self.port.blobs.read(res.base_hash, verify=True))
        step = self.port.blobs.read(res.step_hash, verify=True)
        return model_parts(*replay_step(self.book.spec, params, state, step, res.round))

    def recent(self) -> set[str]:
        """The models (and steps) this job still needs on this node: the last few, and the
        best-scored round's model, which the job's results may hand out (gpuflex.node.core.selection)."""
        results = self.book.ledger.results
        recent = results[-MODELS_KEPT:]
        keep = {x.model_hash for x in recent} | {x.step_hash for x in recent if x.step_hash}
        if len(results) < MODELS_KEPT:
            keep.add(self.book.init_hash)
        best = best_result(results)
        if best is not None:
            keep.add(best.model_hash)
        return keep

    def prune(self) -> None:
        """Delete the model (and step) that the last commit moved out of ``recent``."""
        results = self.book.ledger.results
        gone = len(results) - MODELS_KEPT  # the round whose model just left the window
        if gone < 0:
            return
        old = results[gone - 1] if gone else None
        stale = {self.book.init_hash} if old is None else {old.model_hash, old.step_hash or ""}
        # A best model that a better round has just replaced is no longer needed either.
        stale |= {self._best_kept} if self._best_kept else set()
        best = best_result(results)
        self._best_kept = best.model_hash if best is not None else ""
        for digest in stale - self.recent() - self.port.blobs_in_use() - {""}:
            try:
                self.port.blobs.discard(digest)
            except OSError as exc:
                log.warning("could not delete old model blob %s: %s", str(digest)[:12], exc)
