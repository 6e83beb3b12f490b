"""Dynamic batching on one serving node: requests queue, join the running batch between
decode steps as the batch size and the memory budget allow, and get their text as it is made.

One trio task drives the engine; each engine call (a prefill or a decode step) runs on a
worker thread, so the node's event loop keeps answering the mesh and the API meanwhile.
When the batch is empty, the first request waits ``collect_s`` (a few milliseconds) for
others to arrive, so that requests arriving together share their prefill.

Memory: a sequence reserves room for its prompt and its ``max_tokens`` in the KV cache, at
the batch's widest row (left padding), and is admitted only while the reservations fit the
KV budget (``memory_mb``, or less where the device has less free: ``gpuflex.serve.fit``); one
that could never fit is refused at once with the reason. Should the device still run out of
memory (another process took it since the fitting probe), the batch's requests fail with the
reason and the batch limit is halved, as training backs off its micro-batch.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from gpuflex.ml.fit import free_memory, is_oom
from gpuflex.serve import BadRequest, Overloaded, ServeError
from gpuflex.serve.engine import BatchEngine, Seq, Tamper, max_positions
from gpuflex.serve.request import GenRequest
from gpuflex.serve.stats import ServeStats
from gpuflex.serve.textstream import Finish, TextStream

log = logging.getLogger("gpuflex.serve")
#: How long the first request into an empty batch waits for company.
COLLECT_S = 0.004


@dataclass
class Ticket:
    """One request inside the scheduler."""

    seq: Seq
    text: TextStream
    send: trio.MemorySendChannel[dict[str, Any]]
    recv: trio.MemoryReceiveChannel[dict[str, Any]]
    reserved: int  # cache positions reserved
    started: float = field(default_factory=time.monotonic)
    first_at: float | None = None
    cancelled: bool = False


class Scheduler:
    def __init__(self, name: str, model: Any, tokenizer: Any, eos_id: int | None, *, max_batch: int,
                 memory_bytes: int, max_prompt_tokens: int, max_new_tokens: int, queue: int,
                 stats: ServeStats | None = None, tamper: Tamper | None = None) -> None:
        self.name = name
        self.engine = BatchEngine(model, eos_id, tamper)
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.max_batch, self.memory_bytes, self.queue_limit = max_batch, memory_bytes, queue
        self.max_prompt_tokens, self.max_new_tokens = max_prompt_tokens, max_new_tokens
        self.per_token = self.engine.per_token
        self.positions = max_positions(model.config)
        self.waiting: deque[Ticket] = deque()
        self.active: dict[int, Ticket] = {}
        #: Requests past the queue check whose prompt is still being encoded: they hold their
        #: place in the queue, or a burst arriving together all passes the check before any is
        #: queued and the queue limit does not hold (five arriving together at a queue of 2 were
        #: all queued).
        self.arriving = 0
        self.stats = stats or ServeStats()
        self._ids = itertools.count(1)
        self._wake = trio.Event()

    # -- the caller's side ----------------------------------------------------------------------

    @property
    def load(self) -> int:
        return len(self.active) + len(self.waiting) + self.arriving

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) or (
            [self.eos_id] if self.eos_id is not None else [0])

    async def generate(self, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Items ``{"text": piece}`` as the completion grows, then ``{"finish", "usage"}``."""
        queued = len(self.waiting) + self.arriving
        if queued >= self.queue_limit:
            raise Overloaded(f"model {self.name!r} has {queued} requests waiting; try again shortly")
        self.arriving += 1
        try:
            ticket = await self._ticket(req)
        finally:
            self.arriving -= 1
        self.waiting.append(ticket)
        self._wake.set()
        try:
            async with ticket.recv:
                async for item in ticket.recv:
                    yield item
        finally:
            ticket.cancelled = True  # the caller left (or is done): free its place at the next step
            self._wake.set()

    async def _ticket(self, req: GenRequest) -> Ticket:
        """``req`` encoded and checked against this server's limits; BadRequest if it cannot fit."""
        ids = await trio.to_thread.run_sync(self._encode, req.prompt)
        if len(ids) > self.max_prompt_tokens:
            raise BadRequest(f"the prompt is {len(ids)} tokens; this server takes at most {self.max_prompt_tokens}")
        room = self.positions - len(ids)
        if room < 1:
            raise BadRequest(f"the prompt is {len(ids)} tokens; the model's context is {self.positions}")
        max_new = min(req.max_tokens, self.max_new_tokens, room)
        reserved = len(ids) + max_new
        if reserved * self.per_token > self.memory_bytes:
            raise BadRequest(f"a prompt of {len(ids)} tokens plus {max_new} new ones needs "
                             f"{reserved * self.per_token >> 10} KiB of cache; this server allows "
                             f"{self.memory_bytes >> 10} KiB")
        send, recv = trio.open_memory_channel[dict[str, Any]](max_new + 4)
        seq = Seq(next(self._ids), ids, max_new, req.temperature, req.top_p, req.seed, req.logprobs)
        return Ticket(seq, TextStream(self._decode, req.stop), send, recv, reserved)

    # -- the batch loop --------------------------------------------------------------------------

    def _admissible(self) -> list[Ticket]:
        """Waiting tickets that fit now, in arrival order (a big one at the head waits; the
        ones behind it wait too, so it is not starved)."""
        chosen: list[Ticket] = []
        width = self.engine.width
        rows = len(self.active)
        reserved_max = max((t.reserved for t in self.active.values()), default=0)
        while self.waiting and rows + len(chosen) < self.max_batch:
            head = self.waiting[0]
            if head.cancelled:
                self.waiting.popleft()
                continue
            widest = max(width, reserved_max, head.reserved, *(t.reserved for t in chosen))
            if (rows + len(chosen) + 1) * widest * self.per_token > self.memory_bytes:
                break
            chosen.append(self.waiting.popleft())
        return chosen

    async def run(self) -> None:
        while True:
            if not self.active and not self.waiting:
                await self._wake.wait()
                self._wake = trio.Event()
                await trio.sleep(COLLECT_S)
            self._retire_cancelled()
            new = self._admissible()
            try:
                if new:
                    for t in new:
                        self.active[t.seq.rid] = t
                    self._deliver(await trio.to_thread.run_sync(self.engine.admit, [t.seq for t in new]))
                elif self.engine.size:
                    self._deliver(await trio.to_thread.run_sync(self.engine.step))
                elif self.waiting:  # cancelled heads only, or nothing fits: wait for a change
                    self._wake = trio.Event()
                    await self._wake.wait()
            except Exception as exc:  # the model failed: every request in the batch gets the reason
                if is_oom(exc):
                    self._out_of_memory()
                else:
                    log.exception("serving %s failed", self.name)
                    self._fail_all(ServeError(f"the model failed: {exc.__class__.__name__}: {exc}"))
            await trio.lowlevel.checkpoint()

    def _deliver(self, made: list[tuple[Seq, int]]) -> None:
        done: set[int] = set()
        now = time.monotonic()
        for seq, token in made:
            t = self.active[seq.rid]
            if t.first_at is None:
                t.first_at = now
                self.stats.first_token(now - t.started)
            self.stats.tokens(1)
            eos = self.eos_id is not None and token == self.eos_id
            ids = seq.out_ids[:-1] if eos else seq.out_ids
            piece = t.text.feed(ids, eos=eos, at_limit=len(seq.out_ids) >= seq.max_new)
            item: dict[str, Any] = {"text": piece, "n": len(seq.out_ids)}
            if seq.logprobs:
                item["token"], item["logprob"] = token, seq.out_logprobs[-1]
            self._put(t, item)
            if t.text.finish is not None or t.cancelled:
                done.add(seq.rid)
                finish = t.text.finish or Finish.STOP
                self._put(t, {"finish": str(finish), "usage": {
                    "prompt_tokens": len(seq.prompt_ids), "completion_tokens": len(seq.out_ids),
                    "total_tokens": len(seq.prompt_ids) + len(seq.out_ids)}})
                self.stats.finished(now - t.started)
        self._drop(done)

    def _put(self, t: Ticket, item: dict[str, Any]) -> None:
        try:
            t.send.send_nowait(item)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            t.cancelled = True

    def _drop(self, rids: set[int]) -> None:
        if not rids:
            return
        self.engine.retire(rids)
        for rid in rids:
            t = self.active.pop(rid, None)
            if t is not None:
                t.send.close()

    def _retire_cancelled(self) -> None:
        self._drop({rid for rid, t in self.active.items() if t.cancelled})

    def _out_of_memory(self) -> None:
        """The device ran out of memory mid-batch: the batch's requests fail (their cache is
        lost), the device gets its cached blocks back and the batch limit is halved."""
        rows = max(1, len(self.active))
        self.max_batch = max(1, min(self.max_batch, rows) // 2)
        log.warning("serving %s ran out of memory on %s with %d sequences; now at most %d at once",
                    self.name, self.engine.device, rows, self.max_batch)
        self._fail_all(ServeError(f"the server ran out of device memory with {rows} requests in its batch; "
                                  "try again", 503))
        free_memory(self.engine.device)

    def _fail_all(self, exc: ServeError) -> None:
        for t in list(self.active.values()):
            self._put(t, {"error": str(exc)})
        self._drop(set(self.active))
