"""Jobs on one node: receiving and persisting JobSpecs, presence, catch-up sync, and the API.

A job is identified by the digest of its signed JobSpec envelope, so two submissions of the
same file are two jobs, and nobody can alter a job's settings without changing its id.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from gpuflex.node.control import ApiError
from gpuflex.node.ledger import LedgerError, prefer_chain, verify_chain
from gpuflex.node.messages import (
    ABORT,
    JOB,
    PARTIAL,
    PLAN,
    PRESENCE,
    RESULT,
    SECAGG_RECOVER,
    SYNC,
    UPDATE,
)
from gpuflex.node.rounds import JobRunner
from mesh.codec import Envelope, WireError, open_envelope, seal
from mesh.fsutil import StateWriteError, atomic_write
from mesh.messaging import Inbound, Rejected, SendError

if TYPE_CHECKING:
    from gpuflex.node.runtime import NodeRuntime

log = logging.getLogger("gpuflex.jobs")
PRESENCE_EVERY_S = 3.0
QUORUM_CHECK_S = 1.0


def pin_spec(spec: Any, home: Path) -> Any:
    """The spec as this node signs it: the workload may record hashes of the inputs every
    member must hold alike (a language model's base weights and tokenizer)."""
    from gpuflex.ml.workload import WorkloadUnavailable, pin_job_spec

    try:
        return pin_job_spec(spec, home)
    except WorkloadUnavailable as exc:
        raise ApiError(str(exc)) from None


def job_id_of(env: Envelope) -> str:
    return env.digest[:16]


class JobManager:
    def __init__(self, runtime: NodeRuntime) -> None:
        self.rt = runtime
        self.mesh = runtime.mesh
        self.events = runtime.events
        self.home = runtime.home
        self.jobs_dir = self.home / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.runners: dict[str, JobRunner] = {}
        self.contributed: dict[str, int] = {}
        self.unsaved_jobs: set[str] = set()  # jobs whose file could not be written, reported once
        self.adversary: Any = None
        if runtime.options.adversary:
            from gpuflex.adversary import make_adversary

            self.adversary = make_adversary(runtime.options.adversary)
        self._nursery: trio.Nursery | None = None
        self.mesh.direct_only.add(PRESENCE)  # refreshed every few seconds: one hop is enough
        h = self.mesh.handlers
        h.register(JOB, self._on_job)
        h.register(PRESENCE, self._on_presence)
        h.register(SYNC, self._on_sync)
        for kind, attr in ((PLAN, "on_plan"), (UPDATE, "on_update"), (PARTIAL, "on_partial"),
                           (RESULT, "on_result"), (ABORT, "on_abort"), (SECAGG_RECOVER, "on_secagg_recover")):
            h.register(kind, self._route(attr))

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for path in sorted(self.jobs_dir.glob("*/job.frame")):
                try:
                    self._adopt(open_envelope(path.read_bytes(), expect_kind=JOB), persist=False)
                except (WireError, ValueError, OSError) as exc:
                    self.events.emit("state_corrupt", message=f"job file {path} is unreadable: {exc}")
            task_status.started()
            nursery.start_soon(self._presence_loop)
            nursery.start_soon(self._quorum_loop)
            nursery.start_soon(self._initial_sync)

    # -- job arrival -------------------------------------------------------------------------

    def _adopt(self, env: Envelope, persist: bool = True) -> JobRunner | None:
        from gpuflex.jobspec import JobSpec, JobSpecError

        job_id = job_id_of(env)
        if job_id in self.runners:
            return None
        body = env.body
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict) or not isinstance(
                body.get("members"), list):
            raise WireError("garbled", "job message lacks spec or members")
        try:
            spec = JobSpec.from_dict(body["spec"], check_paths=False)
        except JobSpecError as exc:
            raise Rejected(f"job {job_id} has an invalid spec: {exc}") from None
        members = [m for m in body["members"] if isinstance(m, str)]
        if persist:
            try:
                atomic_write(self.jobs_dir / job_id / "job.frame", env.raw)
            except OSError as exc:  # a full disk; peers offer the job again (sync, presence) later
                if job_id not in self.unsaved_jobs:
                    self.unsaved_jobs.add(job_id)
                    self.events.emit("state_write_failed", job=job_id, message=(
                        f"job {job_id} not taken on: {exc}; taking it on once the disk has room"))
                return None
        self.unsaved_jobs.discard(job_id)
        runner = JobRunner(self, job_id, spec, members, env.raw, env.sender)
        self.runners[job_id] = runner
        self.events.emit("job_received", job=job_id, peer=env.sender, message=(
            f"job {job_id} ({spec.name}): {spec.rounds} rounds of {spec.model} on {spec.data}"))
        assert self._nursery is not None
        self._nursery.start_soon(runner.run)
        self._nursery.start_soon(self.send_presence)  # be in the next plan without waiting
        return runner

    async def _on_job(self, msg: Inbound) -> None:
        self._adopt(msg.envelope)

    def _route(self, attr: str) -> Any:
        async def handler(msg: Inbound) -> Any:
            body = msg.envelope.body
            job = body.get("job") if isinstance(body, dict) else None
            runner = self.runners.get(job) if isinstance(job, str) else None
            if runner is None:
                if self._nursery is not None and not msg.gossip:
                    self._nursery.start_soon(self.sync_from_peer, msg.via)
                raise Rejected(f"unknown job {job!r}")
            return await getattr(runner, attr)(msg)

        return handler

    # -- presence ----------------------------------------------------------------------------

    async def send_presence(self) -> None:
        # Finished jobs too: a member that fell behind (a full disk, a partition) learns from
        # this that it is behind and catches up, even after everyone else is done.
        active = {j: len(r.ledger) for j, r in self.runners.items() if r.state in ("pending", "running", "done")
                  and r.participates()}
        if active:
            try:
                await self.mesh.broadcast(seal(self.mesh.identity, PRESENCE, {"jobs": active}))
            except Exception as exc:
                log.debug("presence broadcast failed: %s", exc)

    async def _presence_loop(self) -> None:
        while True:
            await self.send_presence()
            await trio.sleep(PRESENCE_EVERY_S)

    async def _on_presence(self, msg: Inbound) -> None:
        jobs = msg.envelope.body.get("jobs") if isinstance(msg.envelope.body, dict) else None
        if not isinstance(jobs, dict):
            raise WireError("garbled", "presence without a job map")
        now = time.time()
        unknown = False
        for job, last_round in jobs.items():
            runner = self.runners.get(job)
            if runner is None:
                unknown = True
                continue
            runner.presence[msg.envelope.sender] = now
            ahead = isinstance(last_round, int) and last_round > len(runner.ledger)
            if ahead and not runner.syncing and self._nursery is not None:
                self._nursery.start_soon(self._catch_up, runner, msg.envelope.sender)
        if unknown and self._nursery is not None and msg.envelope.sender != self.mesh.peer_id:
            self._nursery.start_soon(self.sync_from_peer, msg.envelope.sender)

    # -- saying why a job does not move --------------------------------------------------------

    async def _quorum_loop(self) -> None:
        while True:
            for runner in list(self.runners.values()):
                self._check_quorum(runner)
            await trio.sleep(QUORUM_CHECK_S)

    def _check_quorum(self, runner: JobRunner) -> None:
        """Say so while fewer than min_nodes members are reachable: this side of a partition
        will not commit until more return, and must not look merely slow."""
        if runner.state != "running":
            runner.waiting = ""
            return
        need = runner.spec.min_nodes
        live = runner.live_members()
        reachable = len(live)
        note = f"only {reachable} of min_nodes={need} members reachable; not committing" if reachable < need else ""
        if note:
            note += self._missing_members(runner, live)
        if note == runner.waiting:
            return
        r = len(runner.ledger) + 1
        if note:
            runner.emit("round_waiting", r, message=f"job {runner.job_id} round {r}: waiting, {note}")
        else:
            runner.emit("quorum_restored", r, message=(
                f"job {runner.job_id} round {r}: {reachable} members reachable again (min_nodes={need})"))
        runner.waiting = note

    def _missing_members(self, runner: JobRunner, live: list[str]) -> str:
        """Which members are out of reach and why, as far as this node can tell (their own
        NodeInfo says whether they are behind NAT and which relays hold a slot for them)."""
        allow = set(runner.spec.allowlist)
        missing = sorted(p for p in set(runner.initial_members) | set(runner.eligible())
                         if p not in live and (not allow or p in allow))
        for peer in missing:
            self.mesh.peers.add(peer)  # so the mesh looks up its NodeInfo in the DHT
        return "".join(f"; {peer[-8:]} {self.mesh.nat.why_unreachable(peer)}" for peer in missing[:8])

    def write_failed(self, runner: JobRunner, round_: int, exc: StateWriteError) -> None:
        """A ledger write failed (a full disk): the file keeps the previous rounds, this node
        stays up, and presence from peers brings it up to date once a write succeeds."""
        if str(exc) != runner.write_error:
            runner.emit("state_write_failed", round_, message=(
                f"job {runner.job_id}: round {round_} not recorded: {exc}; the previous ledger is kept, "
                "catching up from peers once the disk has room"))
        runner.write_error = str(exc)

    def write_recovered(self, runner: JobRunner) -> None:
        if runner.write_error:
            runner.write_error = ""
            runner.emit("state_write_recovered", len(runner.ledger), message=(
                f"job {runner.job_id}: the ledger is saved again, at round {len(runner.ledger)}"))

    def blobs_in_use(self) -> set[str]:
        """Every job's recent models and steps: two jobs started alike share an initial model."""
        return set().union(*(r.recent_blobs() for r in self.runners.values()))

    # -- catch-up sync ------------------------------------------------------------------------

    async def _on_sync(self, msg: Inbound) -> dict[str, Any]:
        return {
            "jobs": [r.job_frame for r in self.runners.values()],
            "ledgers": {j: list(r.ledger.frames) for j, r in self.runners.items()},
        }

    async def _initial_sync(self) -> None:
        for _ in range(30):
            peers = self.mesh.peers.alive()
            if peers:
                for peer in peers[:2]:
                    await self.sync_from_peer(peer)
                return
            await trio.sleep(1.0)

    async def _catch_up(self, runner: JobRunner, peer: str) -> None:
        runner.syncing = True
        try:
            await self.sync_from_peer(peer)
        finally:
            runner.syncing = False

    async def sync_from_peer(self, peer: str) -> bool:
        """Learn jobs and adopt any longer verified ledger that ``peer`` holds."""
        try:
            reply = await self.mesh.request(peer, seal(self.mesh.identity, SYNC, {}), timeout=20)
        except SendError as exc:
            log.info("sync from %s failed: %s", peer[-8:], exc)
            return False
        if not isinstance(reply, dict):
            return False
        for frame in reply.get("jobs", []) or []:
            try:
                self._adopt(open_envelope(frame, expect_kind=JOB))
            except (WireError, Rejected) as exc:
                log.info("ignored job from sync: %s", exc)
        for job_id, frames in (reply.get("ledgers") or {}).items():
            runner = self.runners.get(job_id)
            if runner is not None and isinstance(frames, list):
                await self._adopt_ledger(runner, frames, peer)
        return True

    async def _adopt_ledger(self, runner: JobRunner, frames: list[Any], peer: str) -> None:
        async with runner.apply_lock:
            if frames == runner.ledger.frames[: len(frames)]:
                return
            try:
                results = verify_chain(frames, runner.job_id)
                if not prefer_chain(runner.ledger.results, results):
                    return
                forked = frames[: len(runner.ledger.frames)] != runner.ledger.frames
                await runner._model(results[-1].model_hash, [peer, results[-1].coordinator])
                runner.ledger.replace(frames)
                self.write_recovered(runner)
                if forked:
                    self.events.emit("ledger_fork_resolved", job=runner.job_id, peer=peer, round=len(results),
                                     message=f"job {runner.job_id}: switched to the winning branch from {peer[-8:]}")
            except (LedgerError, WireError) as exc:
                self.events.emit("rejected", job=runner.job_id, peer=peer, message=f"ledger from {peer[-8:]}: {exc}")
                self.penalise(peer)
                return
            except StateWriteError as exc:
                self.write_failed(runner, len(results), exc)
                return
            except Exception as exc:
                log.warning("could not adopt the ledger from %s: %s", peer[-8:], exc)
                return
            self.events.emit("ledger_synced", job=runner.job_id, peer=peer, round=len(runner.ledger),
                             message=f"job {runner.job_id}: caught up to round {len(runner.ledger)} from {peer[-8:]}")
            runner._notify()

    async def sync_from_peers(self, runner: JobRunner, prefer: list[str] | None = None) -> None:
        for peer in [*(prefer or []), *self.mesh.peers.alive()][:4]:
            if peer != self.mesh.peer_id and await self.sync_from_peer(peer):
                return

    # -- credit and penalties ------------------------------------------------------------------

    def credit(self, peer: Any) -> None:
        if isinstance(peer, str):
            self.contributed[peer] = self.contributed.get(peer, 0) + 1

    def rounds_contributed(self, peer: str) -> int:
        return self.contributed.get(peer, 0)

    def penalise(self, peer: str) -> None:
        self.mesh.peers.penalise(peer, 1.0)

    # -- control API ---------------------------------------------------------------------------

    def _find(self, params: dict[str, Any]) -> JobRunner:
        key = params.get("job")
        if not self.runners:
            raise ApiError("this node knows no jobs yet")
        if not key:
            return list(self.runners.values())[-1]
        matches = [r for j, r in self.runners.items() if j.startswith(str(key)) or r.spec.name == key]
        if len(matches) != 1:
            raise ApiError(f"unknown job {key!r}" if not matches else f"job prefix {key!r} is ambiguous")
        return matches[0]

    async def api_jobs(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return [r.summary() for r in reversed(list(self.runners.values()))]

    async def api_job_status(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._find(params).summary()

    async def api_ledger(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return self._find(params).ledger_rows()

    async def api_submit(self, params: dict[str, Any]) -> dict[str, Any]:
        from gpuflex.jobspec import JobSpec, JobSpecError

        try:
            spec = JobSpec.from_dict(params.get("spec") or {}, check_paths=True)
        except JobSpecError as exc:
            raise ApiError(str(exc)) from None
        spec = await trio.to_thread.run_sync(pin_spec, spec, self.home)
        members = sorted({self.mesh.peer_id, *self.mesh.peers.alive()})
        frame = seal(self.mesh.identity, JOB, {"spec": spec.to_dict(), "members": members, "created": time.time()})
        env = open_envelope(frame, expect_kind=JOB)
        await self.mesh.broadcast(frame)
        return {"job_id": job_id_of(env), "members": members}

    async def api_results(self, params: dict[str, Any]) -> dict[str, Any]:
        from gpuflex.node.export import export_results

        runner = self._find(params)
        out = params.get("out")
        if not isinstance(out, str) or not out:
            raise ApiError("results need an output directory ('out')")
        try:
            files = await trio.to_thread.run_sync(export_results, runner, Path(out))
        except OSError as exc:
            raise ApiError(f"could not write results to {out}: {exc}") from None
        return {"files": [str(f) for f in files]}
