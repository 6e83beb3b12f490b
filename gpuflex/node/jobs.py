"""Jobs on one node: receiving and persisting JobSpecs, presence, catch-up sync, and the API.

A job is identified by the digest of its signed JobSpec envelope, so two submissions of the
same file are two jobs, and nobody can alter a job's settings without changing its id. Each
job runs in its own ``JobDriver``, which sees the node only through a ``JobPort``; the
manager routes each job's messages to it and calls its methods, never its internals. A job
is adopted only if this node's policy takes it on (``admission``); a refused one is not
saved, and the node keeps relaying its frame like any gossip (relaying runs nothing).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import trio

from gpuflex.jobpolicy import PLUGIN_FIELDS, JobPolicy, Refusal, RefusalKind
from gpuflex.node.admission import Admission
from gpuflex.node.clock import DeadlineClock
from gpuflex.node.control import ApiError
from gpuflex.node.core.kinds import EventKind, JobState
from gpuflex.node.core.messages import JOB, PRESENCE, SYNC, created_at
from gpuflex.node.crashmark import CrashMarks
from gpuflex.node.driver import JobDriver
from gpuflex.node.events import EventLog
from gpuflex.node.faults import NO_FAULTS, Faults
from gpuflex.node.nodeport import NodePort, NodeServices
from gpuflex.node.prepare import TrainerFactory, load_trainer
from gpuflex.node.presence import (
    PRESENCE_MARKS,
    group_recipients,
    make_presence,
    parse_presence,
    recipients,
)
from gpuflex.node.state import JobInfo
from gpuflex.node.summary import brief
from gpuflex.node.sync import CatchUp
from gpuflex.nodeconfig import NodeConfig
from gpuflex.plugins import is_plugin_path
from gpuflex.safetext import printable
from mesh.codec import Envelope, WireError, WireReason, open_envelope, seal
from mesh.fsutil import atomic_write
from mesh.health import PeerRecord, PeerState
from mesh.messaging import Inbound, Rejected
from mesh.node import MeshNode
from mesh.overlay import neighbours

log = logging.getLogger("gpuflex.jobs")
#: Presence is refreshed this often; PRESENCE_FRESH_S (state.py) allows three missed beats.
PRESENCE_EVERY_S = 3.0
#: A new job is announced in a presence within this long: jobs arriving together share one.
PRESENCE_SOON_S = 0.2
#: Presence broadcasts in flight at once; beyond that the next waits for the one before.
PRESENCE_SENDS_AT_ONCE = 3
WATCH_PER_JOB = 16  #: members of a running job watched first-hand, picked as mesh.overlay picks
#: How often each job re-checks whether min_nodes members are reachable, to say so.
QUORUM_CHECK_S = 1.0
#: At start a node tries this many times, a second apart, for a first peer to sync from and a sync that succeeds.
INITIAL_SYNC_TRIES = 30
#: Peers asked at start, and at most peers asked when a job needs to catch up.
INITIAL_SYNC_PEERS, CATCH_UP_PEERS = 2, 4
#: A peer whose ledger changed nothing here is not asked again for this long; (job, peer) pairs kept.
FRUITLESS_SYNC_S, MAX_FRUITLESS = 30.0, 4096
#: Peers whose verified contributions are counted (``credit``): the most credited are kept.
MAX_CREDITED = 4096


def pin_spec(spec: Any, home: Path, config: NodeConfig | None = None) -> Any:
    """The spec as this node signs it: the workload may record hashes of the inputs every
    member must hold alike (a language model's base weights and tokenizer)."""
    from gpuflex.ml.workload import WorkloadUnavailable, pin_job_spec

    try:
        return pin_job_spec(spec, home, config)
    except WorkloadUnavailable as exc:
        raise ApiError(str(exc)) from None


def job_id_of(env: Envelope) -> str:
    return env.digest[:16]


class JobManager:
    def __init__(self, mesh: MeshNode, events: EventLog, home: Path, faults: Faults = NO_FAULTS,
                 config: NodeConfig | None = None, trainers: TrainerFactory | None = None,
                 clock: DeadlineClock | None = None) -> None:
        self.mesh, self.events, self.home, self.faults = mesh, events, home, faults
        self.clock = clock or DeadlineClock()  # a simulator's ties the wall clock to its modelled time
        self.config = config if config is not None else NodeConfig()
        self._trainers = trainers or partial(load_trainer, config=self.config)  # a simulator's stand-in, or torch
        self.admission = Admission(JobPolicy(self.config, own_id=mesh.peer_id), events,
                                   penalise=lambda peer, points: mesh.peers.penalise(peer, points).penalty)
        self.jobs_dir = home / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.marks = CrashMarks(self.jobs_dir)
        self.drivers: dict[str, JobDriver] = {}
        self.contributed: dict[str, int] = {}
        self.unsaved_jobs: set[str] = set()  # jobs whose file could not be written, reported once
        self._syncing: set[str] = set()  # jobs catching up from a peer that said it is ahead
        self._fruitless: dict[tuple[str, str], float] = {}  # (job, peer) -> when its ledger changed nothing
        self._nursery: trio.Nursery | None = None
        self._presence_sends = 0  # presence broadcasts in flight (_presence_loop)
        self._presence_due = trio.Event()
        self._spread: dict[str, dict[str, Any]] = {}  # job -> presence.recipients' cache
        self.syncer = CatchUp(mesh, self.drivers, self._adopt)
        self._services = NodeServices(credit=self.credit, blobs_in_use=self.blobs_in_use,
                                      catch_up=self.sync_from_peers, announce_soon=self.announce_soon)
        self.mesh.direct_only.add(PRESENCE)  # refreshed every few seconds: one hop is enough
        h = self.mesh.handlers
        h.register(JOB, self._on_job)
        h.register(PRESENCE, self._on_presence)
        h.register(SYNC, self.syncer.answer)
        for kind in JobDriver.HANDLED:
            h.register(kind, self._route, max_payload=self._payload_limit if kind in JobDriver.WITH_PAYLOAD else 0)
        self.mesh.peers.on_change(self._peer_changed)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        if self.admission.policy.allows_everything:
            log.warning("this node allows every plug-in (%s): any publisher it accepts can run code on it",
                        ", ".join(self.config.allow_plugins))
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.syncer.run_in(nursery)
            saved = []
            for path in sorted(self.jobs_dir.glob("*/job.frame")):
                try:
                    saved.append(open_envelope(path.read_bytes(), expect_kind=JOB))
                except (WireError, Rejected, OSError) as exc:
                    self.events.emit(EventKind.STATE_CORRUPT, message=f"job file {path} is unreadable: {exc}")
            # Oldest first, so "newest first" (job list, a bare job status) holds after a restart.
            for env in sorted(saved, key=created_at):
                try:
                    self._adopt(env, resumed=True)
                except (WireError, Rejected) as exc:
                    self.events.emit(EventKind.STATE_CORRUPT, message=f"job {job_id_of(env)} is unreadable: {exc}")
            task_status.started()
            nursery.start_soon(self._presence_loop)
            nursery.start_soon(self._quorum_loop)
            nursery.start_soon(self._initial_sync)

    def _peer_changed(self, rec: PeerRecord, old: PeerState, new: PeerState) -> None:
        for driver in self.drivers.values():
            driver.notify()

    def _unfinished(self) -> Counter[str]:
        """Jobs not yet done or failed here, per publisher: what the caps count."""
        return Counter(d.book.info.submitted_by for d in self.drivers.values()
                       if d.state in (JobState.PENDING, JobState.RUNNING))

    def _adopt(self, env: Envelope, resumed: bool = False) -> JobDriver | None:
        """Take on the job of a JOB frame if this node's policy allows it (``resumed``: read
        from this node's disk at start, where caps do not apply); None when it is not new or
        is refused (reported once by ``admission``)."""
        from gpuflex.jobspec import JobSpec, JobSpecError

        job_id = job_id_of(env)
        if job_id in self.drivers or self.admission.refused(job_id) is not None:
            return None
        body = env.body
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict) or not isinstance(
                body.get("members"), list):
            raise WireError(WireReason.GARBLED, "job message lacks spec or members")
        try:
            spec = JobSpec.from_dict(body["spec"])
        except JobSpecError as exc:
            self.admission.refuse_invalid(job_id, env.sender, str(exc), penalise=not resumed)
            return None
        if self.admission.judge(job_id, spec, env.sender, None if resumed else self._unfinished()) is not None:
            return None
        plugins = any(is_plugin_path(getattr(spec, name) or "") for name in PLUGIN_FIELDS)
        if resumed and plugins and self.marks.stopped_inside(job_id):
            self.admission.refuse(job_id, Refusal(RefusalKind.CRASHED, (
                "its plug-in code was running when this node last stopped without shutting down, so it may "
                f"have crashed the node; not resumed (delete {self.marks.marker(job_id)} to run it again)")),
                env.sender, spec.name, penalise=False)
            return None
        members = tuple(sorted({m for m in body["members"] if isinstance(m, str)}))
        if not resumed:
            try:
                atomic_write(self.jobs_dir / job_id / "job.frame", env.raw)
            except OSError as exc:  # a full disk; peers offer the job again (sync, presence) later
                if job_id not in self.unsaved_jobs:
                    self.unsaved_jobs.add(job_id)
                    self.events.emit(EventKind.STATE_WRITE_FAILED, job=job_id, message=(
                        f"job {job_id} not taken on: {exc}; taking it on once the disk has room"))
                return None
        self.unsaved_jobs.discard(job_id)
        info = JobInfo(job_id=job_id, spec=spec, initial_members=members, frame=env.raw, submitted_by=env.sender)
        port = NodePort(self.mesh, self.events, self.home, job_id, self._services, self.clock,
                        marks=self.marks if plugins else None)
        driver = JobDriver(info, port, self.jobs_dir, faults=self.faults, trainers=self._trainers)
        self.drivers[job_id] = driver
        self.events.emit(EventKind.JOB_RECEIVED, job=job_id, peer=env.sender, message=(
            f"job {job_id} ({printable(spec.name, 60)}): {spec.rounds} rounds of {spec.model} on {spec.data}"))
        assert self._nursery is not None
        self._nursery.start_soon(driver.run)
        self._presence_due.set()  # be in the next plan without waiting
        return driver

    async def _on_job(self, msg: Inbound) -> None:
        self._adopt(msg.envelope)

    async def _route(self, msg: Inbound) -> Any:
        body = msg.envelope.body
        job = body.get("job") if isinstance(body, dict) else None
        driver = self.drivers.get(job) if isinstance(job, str) else None
        if driver is None:
            refused = isinstance(job, str) and self.admission.refused(job) is not None
            if not msg.gossip and not refused:
                self.syncer.trigger(msg.via)
            raise Rejected("a job this node does not run" if refused else f"unknown job {printable(job, 40)}")
        return await driver.handle(msg)

    async def _payload_limit(self, env: Envelope) -> int:
        """An update or partial may be as large as its job's model allows (0 for an unknown job)."""
        job = env.body.get("job") if isinstance(env.body, dict) else None
        driver = self.drivers.get(job) if isinstance(job, str) else None
        return 0 if driver is None else await driver.payload_limit(env.sender)

    def announce_soon(self) -> None:
        """Send presence within ``PRESENCE_SOON_S`` instead of at the next period."""
        self._presence_due.set()

    async def send_presence(self) -> None:
        """Each job's presence to its members alone (``JobDriver.known_members``), one message per
        set of jobs shared with a peer, applied here first: none grows with the mesh's jobs."""
        # Finished jobs too: a member that fell behind (a full disk, a partition) catches up.
        active = {j: d.committed for j, d in self.drivers.items() if d.state != JobState.FAILED and d.participates()}
        # Jobs that failed here, and why: peers leave this node out of their plans and say why.
        failed = dict(islice(((j, why) for j, d in self.drivers.items() if (why := d.failure)), PRESENCE_MARKS))
        if not active and not failed:  # a node in no job sends nothing
            return
        me = self.mesh.peer_id
        try:
            own = make_presence(self.mesh.identity, self.drivers, active, failed, self.mesh.coord.wire(),
                                self.mesh.nat.reachability())
            await self._on_presence(Inbound(open_envelope(own), None, me, gossip=True))
        except (WireError, ValueError, Rejected) as exc:  # a map too large for its kind's limit
            log.debug("own presence not applied: %s", exc)
        alive, shared = set(self.mesh.peers.alive()), {}  # type: ignore[var-annotated]
        for job in [*active, *failed]:
            members = self.drivers[job].known_members() & alive
            for peer in recipients(me, members, self.drivers[job], self._spread.setdefault(job, {})):
                shared.setdefault(peer, []).append(job)
            if self.drivers[job].state == JobState.RUNNING:  # its rounds' members, spread evenly
                self.mesh.watch(self._spread[job].get("spread") or neighbours(me, members, WATCH_PER_JOB),
                                3 * PRESENCE_EVERY_S)
        async with trio.open_nursery() as nursery:
            for group, peers in group_recipients(shared).items():
                try:
                    frame = make_presence(self.mesh.identity, self.drivers,
                                          {j: active[j] for j in group if j in active},
                                          {j: failed[j] for j in group if j in failed}, self.mesh.coord.wire(),
                                          self.mesh.nat.reachability())
                    nursery.start_soon(self.mesh.send_direct, frame, peers)
                except (WireError, ValueError) as exc:
                    log.debug("presence for %d job(s) not sent: %s", len(group), exc)

    async def _presence_loop(self) -> None:
        while True:
            # A few go out side by side: one starved peer held each node's next presence for seconds.
            if self._presence_sends < PRESENCE_SENDS_AT_ONCE and self._nursery is not None:
                self._nursery.start_soon(self._send_presence_counted)
            else:
                await self.send_presence()
            with trio.move_on_after(PRESENCE_EVERY_S):
                await self._presence_due.wait()
                await trio.sleep(PRESENCE_SOON_S)
            self._presence_due = trio.Event()

    async def _send_presence_counted(self) -> None:
        self._presence_sends += 1
        try:
            await self.send_presence()
        finally:
            self._presence_sends -= 1

    async def _on_presence(self, msg: Inbound) -> None:
        presence = parse_presence(msg.envelope)
        sender = presence.sender
        self.mesh.note_coord(sender, presence.coord)  # where it sits (mesh.vivaldi)
        self.mesh.note_reachability(sender, presence.reach)  # whether it can lead (placement)
        for job, why in presence.failed.items():
            driver = self.drivers.get(job)
            if driver is not None:
                driver.saw_presence(sender, None, failed=why)
        unknown = False
        now = trio.current_time()
        for job, seen in presence.jobs.items():
            driver = self.drivers.get(job)
            if driver is None:
                unknown = unknown or self.admission.refused(job) is None
                continue
            ahead = driver.saw_presence(sender, seen)
            # A peer whose last ledger changed nothing here is not asked again for a while,
            # whatever it claims: a claim to be ahead costs the claimant, not this node.
            rested = now >= self._fruitless.get((job, sender), -FRUITLESS_SYNC_S) + FRUITLESS_SYNC_S
            if ahead and rested and job not in self._syncing and self._nursery is not None:
                self._nursery.start_soon(self._catch_up, job, sender)
        if unknown:
            self.syncer.trigger(sender)

    async def _quorum_loop(self) -> None:
        while True:
            for driver in list(self.drivers.values()):
                driver.check_quorum()
            await trio.sleep(QUORUM_CHECK_S)

    def blobs_in_use(self) -> set[str]:
        """Every job's recent models and steps: two jobs started alike share an initial model."""
        return set().union(*(d.recent_blobs() for d in self.drivers.values()))

    async def _initial_sync(self) -> None:
        """Learn the mesh's jobs from the first peers up. A sync that fails (a loaded peer, a
        stream that would not open) is tried again a second later with the peers known by
        then: presence goes only to a job's members, so a node that learnt no job here would
        hear of a running one only by its gossip."""
        for _ in range(INITIAL_SYNC_TRIES):
            results = [await self.syncer.sync_from_peer(peer) for peer in self.mesh.peers.alive()[:INITIAL_SYNC_PEERS]]
            if any(results):
                return
            await trio.sleep(1.0)

    async def _catch_up(self, job: str, peer: str) -> None:
        """Fetch the ledger ``peer``'s presence claims may win; one it does not make this job
        adopt (the claim was false, or stale) is fruitless: not asked again for a while."""
        self._syncing.add(job)
        try:
            adopted = await self.syncer.sync_job(peer, job)
        finally:
            self._syncing.discard(job)
        if not adopted:
            self._fruitless[(job, peer)] = trio.current_time()
            while len(self._fruitless) > MAX_FRUITLESS:
                del self._fruitless[next(iter(self._fruitless))]

    async def sync_from_peers(self, prefer: Sequence[str] = ()) -> None:
        for peer in [*prefer, *self.mesh.peers.alive()][:CATCH_UP_PEERS]:
            if peer != self.mesh.peer_id and await self.syncer.sync_from_peer(peer):
                return

    def credit(self, peer: str) -> None:
        """Count a verified contribution; past ``MAX_CREDITED`` peers the least credited goes."""
        self.contributed[peer] = self.contributed.get(peer, 0) + 1
        if len(self.contributed) > MAX_CREDITED:
            del self.contributed[min(self.contributed, key=self.contributed.__getitem__)]

    def rounds_contributed(self, peer: str) -> int:
        return self.contributed.get(peer, 0)

    def _find(self, params: dict[str, Any]) -> JobDriver:
        key = params.get("job")
        if not self.drivers:
            raise ApiError("this node knows no jobs yet")
        if not key:
            return list(self.drivers.values())[-1]
        matches = [d for j, d in self.drivers.items() if j.startswith(str(key)) or d.spec.name == key]
        if len(matches) != 1:
            raise ApiError(f"unknown job {key!r}" if not matches else f"job prefix {key!r} is ambiguous")
        return matches[0]

    async def api_jobs(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return [d.summary() for d in reversed(list(self.drivers.values()))]

    def job_briefs(self) -> list[dict[str, Any]]:
        """Every job in a few fields, newest first (``status``)."""
        return [brief(d.summary()) for d in reversed(list(self.drivers.values()))]

    async def api_job_status(self, params: dict[str, Any]) -> dict[str, Any]:
        """The JobSummary, with the job's spec (validated when it was adopted: only a valid
        spec makes a driver) and its publisher, which ``jobs`` leaves out to stay small."""
        driver = self._find(params)
        return {**driver.summary(), "spec": driver.spec.to_dict(), "publisher": driver.book.info.submitted_by}

    async def api_ledger(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return self._find(params).ledger_rows()

    async def api_submit(self, params: dict[str, Any]) -> dict[str, Any]:
        from gpuflex.jobspec import JobSpec, JobSpecError

        try:
            spec = JobSpec.from_dict(params.get("spec") or {})
        except JobSpecError as exc:
            raise ApiError(str(exc)) from None
        # The job's first member is this node, and its handle follows the job here: a job this
        # node would not take on is refused now, in one line, rather than published unseen.
        refusal = self.admission.policy.refusal(spec, self.mesh.peer_id, self._unfinished())
        if refusal is not None:
            raise ApiError(f"this node will not run this job: {refusal}")
        spec = await trio.to_thread.run_sync(pin_spec, spec, self.home, self.config)
        # Peers this node heard itself: the job's first members are its first eligible
        # coordinators, and a key known by hearsay alone may never answer (its turns would idle).
        members = sorted({self.mesh.peer_id, *self.mesh.peers.heard()})
        body = {"spec": spec.to_dict(), "members": members, "created": self.clock.wall()}  # as deadlines read time
        frame = seal(self.mesh.identity, JOB, body)
        env = open_envelope(frame, expect_kind=JOB)
        await self.mesh.broadcast(frame)
        return {"job_id": job_id_of(env), "members": members}

    async def api_results(self, params: dict[str, Any]) -> dict[str, Any]:
        from gpuflex.node.export import export_results

        job = self._find(params)
        out = params.get("out")
        if not isinstance(out, str) or not out:
            raise ApiError("results need an output directory ('out')")
        try:
            files = await trio.to_thread.run_sync(export_results, job.export(), Path(out))
        except OSError as exc:
            raise ApiError(f"could not write results to {out}: {exc}") from None
        return {"files": [str(f) for f in files]}
