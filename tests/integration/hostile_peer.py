"""A hostile peer for real-process tests: a bare ``MeshNode`` of our own library with its own
key, on a trio loop in a thread of the test process, and the forgeries it signs.

It never runs a job. It watches what the mesh gossips (plans, results), can act as a member
that sends a signed update of zeros claiming any sample count, answers catch-up sync with any
ledger it likes, serves model blobs, and pushes raw bytes (a re-encoded frame) on the gossip
protocol. Everything it sends is signed with its own keys, as any peer could.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import trio

from gpuflex.node.core.messages import (
    JOB,
    PLAN,
    PRESENCE,
    RESULT,
    SYNC,
    UPDATE,
    Plan,
    Result,
    make_plan,
    parse_plan,
    parse_result,
)
from gpuflex.node.core.modelblob import model_parts
from mesh.blob import blob_hash
from mesh.codec import Envelope, open_envelope, seal
from mesh.framing import write_frame
from mesh.identity import Identity
from mesh.messaging import GOSSIP_PROTOCOL, Inbound
from mesh.node import MeshConfig, MeshNode


async def send_raw(node: MeshNode, peer: str, frame: bytes, tries: int = 1) -> None:
    """Hand ``frame`` to ``peer`` as gossip on a stream of its own, bytes untouched. A stream a
    loaded machine drops is opened again, ``tries`` at most, 0.5 s apart and doubling; the last
    failure is raised."""
    for attempt in range(tries):
        try:
            stream = await node.open(peer, GOSSIP_PROTOCOL, 10)
            await write_frame(stream, frame)
            await stream.close()
            return
        except Exception:  # py-libp2p's stream errors share no base class
            if attempt == tries - 1:
                raise
            await trio.sleep(0.5 * 2**attempt)


def old_digest(frame: bytes) -> str:
    """What a digest was before ids hashed the signed bytes: a hash of the whole frame."""
    return hashlib.blake2b(frame, digest_size=32).hexdigest()


def ground(make: Callable[[], bytes], beat: str, tries: int = 256) -> bytes:
    """Re-sign (fresh nonces) until the frame's digest, old or new, is below ``beat``."""
    frame = make()
    for _ in range(tries):
        if min(open_envelope(frame).digest, old_digest(frame)) < beat:
            return frame
        frame = make()
    return frame


def re_encodings(frame: bytes) -> list[bytes]:
    """The same signed frame with wider msgpack length prefixes: no key needed."""
    header, signature = msgpack.unpackb(frame, raw=False)

    def binary(data: bytes, width: int) -> bytes:
        return {1: b"\xc4", 2: b"\xc5", 4: b"\xc6"}[width] + len(data).to_bytes(width, "big") + data

    out = []
    for array in (b"\x92", b"\xdc\x00\x02", b"\xdd\x00\x00\x00\x02"):
        for wh in (2, 4) if len(header) > 255 else (1, 2, 4):
            for ws in (1, 2, 4):
                copy = array + binary(header, wh) + binary(signature, ws)
                if copy != frame:
                    out.append(copy)
    return out


class HostilePeer:
    def __init__(self, base: Path, bootstrap: str) -> None:
        self.base, self.bootstrap = base, bootstrap
        self.identity = Identity.generate()
        self.peer_id = self.identity.peer_id
        self.plans: list[Plan] = []
        self.results: list[Result] = []
        self.updates: list[Envelope] = []  # updates sent to it directly
        self.sync_ledgers: dict[str, list[bytes]] = {}  # what it answers catch-up sync with
        self.sync_heights: dict[str, int] = {}  # heights it claims beyond those ledgers' lengths
        self.sync_weights: dict[str, int] = {}  # ledger weights (verified contributions) it claims
        self.member_of: dict[str, int] = {}  # job -> the sample count its updates claim
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, daemon=True)
        self.node: MeshNode | None = None
        self._token: Any = None
        self._stop: trio.Event | None = None

    # -- the loop in its thread ------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> HostilePeer:
        self._thread.start()
        if not self._ready.wait(timeout) or self.node is None:
            raise RuntimeError(f"hostile peer did not start: {self._error!r}")
        return self

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to the test by start()
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        cfg = MeshConfig(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=[self.bootstrap], data_dir=self.base,
                         mdns=False, reachability="public")
        async with MeshNode.start(self.identity, cfg) as node, trio.open_nursery() as nursery:
            self.node, self._token, self._stop = node, trio.lowlevel.current_trio_token(), trio.Event()
            self._nursery = nursery
            for kind, handler in ((PLAN, self._on_plan), (RESULT, self._on_result), (UPDATE, self._on_update),
                                  (SYNC, self._on_sync), (JOB, self._ignore), (PRESENCE, self._ignore)):
                node.handlers.register(kind, handler)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()
            node.stop()

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run ``fn(*args)`` on the hostile peer's loop, from the test's thread."""
        self.check_running()
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def check_running(self) -> None:
        """Raise what ended the peer's loop, if it has ended."""
        if not self._thread.is_alive():
            raise RuntimeError(f"the hostile peer's loop has ended: {self._error!r}")

    def close(self) -> None:
        if self._token is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)  # type: ignore[union-attr]
        self._thread.join(30)

    # -- what it hears ---------------------------------------------------------------------------

    async def _ignore(self, msg: Inbound) -> None:
        return None

    async def _on_plan(self, msg: Inbound) -> None:
        plan = parse_plan(msg.envelope)
        self.plans.append(plan)
        claim = self.member_of.get(plan.job)
        if claim is not None and self.peer_id in plan.parent and plan.parent[self.peer_id] is not None:
            self._nursery.start_soon(self._send_update, plan, claim)

    async def _on_result(self, msg: Inbound) -> None:
        self.results.append(parse_result(msg.envelope))

    async def _on_update(self, msg: Inbound) -> None:
        self.updates.append(msg.envelope)

    async def _on_sync(self, msg: Inbound) -> dict[str, Any]:
        """Catch-up sync as honest nodes speak it (``gpuflex.node.sync``), in one page: the
        heights and weights it claims, then the ledger it chose for the job asked."""
        body = msg.envelope.body if isinstance(msg.envelope.body, dict) else {}
        if "job" in body:
            frames = self.sync_ledgers.get(str(body["job"]), [])
            return {"ledger": frames[int(body.get("from", 0)):], "more": False}
        heights = {job: max(len(frames), self.sync_heights.get(job, 0)) for job, frames in self.sync_ledgers.items()}
        return {"jobs": [], "heights": heights, "weights": dict(self.sync_weights)}

    async def _send_update(self, plan: Plan, samples: int) -> None:
        """A member's update of zeros for ``plan``, claiming ``samples``, to its parent; none
        while no result has told it the model's size. A plan can name it before it hears one (on
        a loaded machine its presence counts before round 1 is planned), and an error here would
        end its whole loop: every later attack then found a peer that had stopped."""
        size = self.known_delta_size(plan.job)
        if size is None:
            return
        payload = np.zeros(size, dtype="<f4").tobytes()
        frame = seal(self.identity, UPDATE, {
            "job": plan.job, "round": plan.round, "peer": self.peer_id, "base_hash": plan.base_hash,
            "samples": samples, "delta_hash": blob_hash(payload), "delta_size": size,
            "metrics": {"train_loss": 1.0}, "plan": plan.env.digest})
        parent = plan.parent[self.peer_id]
        assert parent is not None
        with contextlib.suppress(Exception):
            await self.node.request(parent, frame, payload, timeout=20)  # type: ignore[union-attr]

    # -- what it says ----------------------------------------------------------------------------

    def known_delta_size(self, job: str) -> int | None:
        """The model's parameter count, read from an honest update in a gossiped result; None
        before it has heard one."""
        for res in reversed(self.results):
            if res.job == job and res.updates:
                return int(open_envelope(res.updates[0]).body["delta_size"])
        return None

    def delta_size(self, job: str) -> int:
        size = self.known_delta_size(job)
        if size is None:
            raise AssertionError(f"no result of job {job} seen yet")
        return size

    def zero_model(self, job: str) -> str:
        """An all-zero model, served from this peer's blob store; its hash."""
        assert self.node is not None
        return self.node.blobs.put_parts(model_parts(np.zeros(self.delta_size(job), dtype=np.float32), {}))

    async def broadcast(self, frame: bytes) -> None:
        assert self.node is not None
        await self.node.broadcast(frame)

    async def push_raw(self, peers: Sequence[str], frame: bytes) -> None:
        """Gossip ``frame`` as it is, bytes untouched (``broadcast`` would check it first)."""
        assert self.node is not None
        for peer in peers:
            with contextlib.suppress(Exception), trio.move_on_after(10):
                await send_raw(self.node, peer, frame)

    async def presence(self, jobs: dict[str, int], weights: dict[str, int] | None = None) -> None:
        """Presence naming ``jobs``' heights, and the ledger ``weights`` it claims, if given."""
        await self.broadcast(seal(self.identity, PRESENCE, {"jobs": jobs, **({"weights": weights} if weights else {})}))

    async def keep_present(self, job: str) -> None:
        """Presence every second from now on: the plans of ``job`` count it as a member."""
        async def loop() -> None:
            while True:
                with contextlib.suppress(Exception):
                    await self.presence({job: 0})
                await trio.sleep(1.0)

        self._nursery.start_soon(loop)

    def plan(self, *, job: str, round_: int, attempt: int, prev: str, base: str, members: Sequence[str],
             parent: dict[str, str | None] | None = None, train_in_s: float = 20.0, slack: float = 2.0,
             sample_cap: int = 0, identity: Identity | None = None) -> bytes:
        ident = identity or self.identity
        parent = parent or {m: (None if m == ident.peer_id else ident.peer_id) for m in members}
        return make_plan(ident, job=job, round=round_, attempt=attempt, coordinator=ident.peer_id, base_hash=base,
                         prev_result=prev, members=list(parent), parent=parent,
                         train_deadline=time.time() + train_in_s, reduce_slack_s=slack, sample_cap=sample_cap)

    def forged_result(self, *, job: str, round_: int, attempt: int, prev: str, base: str, model: str,
                      members: Sequence[str]) -> bytes:
        """A round with no updates at all, claiming 99 contributors and accuracy 0.999."""
        plan = self.plan(job=job, round_=round_, attempt=attempt, prev=prev, base=base,
                         members=[self.peer_id, *[m for m in members if m != self.peer_id]])
        return seal(self.identity, RESULT, {
            "job": job, "round": round_, "attempt": attempt, "coordinator": self.peer_id, "prev_result": prev,
            "base_hash": base, "model_hash": model, "plan": plan, "updates": [], "partials": [],
            "contributors": [], "absent": [], "strategy": "fedavg",
            "metrics": {"accuracy": 0.999, "loss": 0.0, "contributors": 99, "samples": 10**9}})

    def forged_chain(self, *, job: str, rounds: int, base: str, model: str, members: Sequence[str],
                     beat: str) -> list[bytes]:
        """``rounds`` forged rounds from the start; round 1 ground to beat digest ``beat``."""
        frames: list[bytes] = []
        prev = ""
        for r in range(1, rounds + 1):
            def make(r: int = r, prev: str = prev, base: str = base) -> bytes:
                return self.forged_result(job=job, round_=r, attempt=0, prev=prev, base=base, model=model,
                                          members=members)
            frame = ground(make, beat) if r == 1 else make()
            frames.append(frame)
            env = open_envelope(frame)
            prev, base = env.digest, model
        return frames
