"""Many GPUFlex nodes in one process, on a modelled network, under trio's MockClock.

Each simulated node is the production node minus its sockets and its torch: a real
``MeshNode`` (liveness, discovery, gossip, NAT routing) on ``mesh.testing.simnet``'s modelled
network, and a real ``JobManager`` with its drivers and round roles, whose trainer is a
stand-in: it returns an update of a chosen size after a chosen number of modelled compute
seconds (divided by the node's speed factor). Nothing else is replaced. Blocking work the
node would hand to a thread runs inline instead (``inline_threads``), so it costs modelled
time only where the stand-in trainer says so.

``Simulation.run`` starts the nodes in waves, submits one job from the first node, follows
the rounds, plays a churn trace, and samples every node's traffic once a modelled second.
"""

from __future__ import annotations

import gc
import logging
import math
import random
import shutil
import tempfile
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import trio

from gpuflex.jobspec import JobSpec
from gpuflex.node.clock import DeadlineClock
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.messages import JOB
from gpuflex.node.events import EventLog
from gpuflex.node.jobs import JobManager, job_id_of
from mesh.codec import open_envelope, register_kind, seal
from mesh.health import HealthConfig, PeerState
from mesh.identity import Identity
from mesh.messaging import GOSSIP_PROTOCOL, Inbound
from mesh.node import MeshConfig, MeshNode
from mesh.reachability import Reachability
from mesh.testing.simnet import LinkModel, SimNetwork

log = logging.getLogger("gpuflex.sim")
#: A gossiped message of the simulator's own: how far and how fast gossip reaches, at what cost.
SIM_PROBE = "sim_probe"
register_kind(SIM_PROBE, 4096)
#: Bytes of the probe's body: about a plan's or a result's frame.
PROBE_BYTES = 2048
#: A round not committed for this many modelled seconds is reported: where the nodes are.
STALL_REPORT_S = 15.0
#: Modelled compute seconds owed by stand-in trainers that ran inline, slept by ``inline_threads``.
_owed: list[float] = [0.0]


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Python's cycle collector, tuned for one process holding a thousand nodes: what is
    there before the run (modules, the nodes' keys) is frozen out of its scans, and it runs
    after 50,000 allocations instead of 700. With the defaults, each full collection walks
    every object of every node (a fifth of the CPU at 100 nodes, more the larger the mesh);
    a node process of its own holds one node's objects and keeps the defaults."""
    gc.collect()
    gc.freeze()
    old = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


@contextmanager
def inline_threads() -> Iterator[None]:
    """Run ``trio.to_thread.run_sync`` work inline for the duration (and sleep what a stand-in
    trainer says its work took): under MockClock a real thread would let the clock jump while
    it runs, and a thousand nodes' threads would cost more than their work."""
    original = trio.to_thread.run_sync

    async def run_inline(fn: Callable[..., Any], *args: Any, **_: Any) -> Any:
        out = fn(*args)
        owed, _owed[0] = _owed[0], 0.0
        if owed > 0:
            await trio.sleep(owed)
        else:
            await trio.lowlevel.checkpoint()
        return out

    trio.to_thread.run_sync = run_inline  # type: ignore[assignment]
    try:
        yield
    finally:
        trio.to_thread.run_sync = original


def modelled_wall_time(epoch: float) -> float:
    """Wall-clock seconds in modelled time: ``epoch`` (when the network was made) plus trio's."""
    return epoch + trio.current_time()


#: The events that say what became of a node's own update or partial (``SimEvents.sending``).
SENDING_KINDS = frozenset({EventKind.UPDATE_SENT, EventKind.UPDATE_FAILED, EventKind.PARTIAL_SENT,
                           EventKind.PARTIAL_FAILED, EventKind.SEND_RETRIED, EventKind.WORK_DROPPED,
                           EventKind.REDUCE_EMPTY, EventKind.RESEND, EventKind.LEADER_DOWN})


#: The steps of a round whose first time at each node the simulation keeps (``SimEvents.reached``).
TIMELINE_KINDS = (EventKind.ROUND_COMMITTED, EventKind.PLAN_RECEIVED, EventKind.TRAINED, EventKind.UPDATE_SENT,
                  EventKind.PARTIAL_SENT)


class SimEvents(EventLog):
    """A node's event log that also tells the simulation which rounds' updates a parent took
    from this node (``update_sent``: a leader or root accepted it): an accepted update of a
    node that stays up must reach its round's result, whatever else the churn takes."""

    def __init__(self, on_sent: Callable[[int, str], None]) -> None:
        super().__init__(history=32)
        self._on_sent = on_sent
        # What became of this node's own work, kept apart: peer events fill the history of 32,
        # and a stalled round's report then had nothing to say of a leader's partial.
        self.sending: deque[tuple[EventKind, int | None, str]] = deque(maxlen=6)  # kind, round, text
        # When this node first reached each step of a round (``TIMELINE_KINDS``): where a round's
        # time goes, across the mesh (``Simulation._timeline``).
        self.reached: dict[tuple[EventKind, int], float] = {}
        self.last_in: dict[int, float] = {}  # round -> when work (an update or partial) last came in

    def emit(self, type_: Any, *, job: str | None = None, round: int | None = None,
             peer: str | None = None, message: str = "", **extra: Any) -> dict[str, Any]:
        if type_ == EventKind.UPDATE_SENT and round is not None and peer is not None:
            self._on_sent(round, peer)
        if type_ in TIMELINE_KINDS and round is not None:
            self.reached.setdefault((type_, round), trio.current_time())
        if type_ in (EventKind.UPDATE_RECEIVED, EventKind.PARTIAL_VERIFIED) and round is not None:
            self.last_in[round] = trio.current_time()
        if type_ in SENDING_KINDS:
            self.sending.append((type_, round, f"t={trio.current_time():.1f} {message[:200]}"))
        return super().emit(type_, job=job, round=round, peer=peer, message=message, **extra)


def emit_event(events: EventLog, kind: Any, **fields: Any) -> None:
    """A mesh event into the node's event log, as the runtime passes them on."""
    events.emit(kind, **fields)


@lru_cache(maxsize=16)
def shared_delta(dim: int, value: float) -> np.ndarray:
    """A stand-in update, one read-only buffer shared by every node that sends the same one:
    a thousand nodes' 10 MB updates would otherwise be 10 GB of identical arrays. The node
    still encodes, hashes, signs and sends its own bytes of it (production code); only the
    trainer's output is shared, and read-only, so code that wrote into it would fail loudly."""
    delta = np.full(dim, value, dtype=np.float32)
    delta.flags.writeable = False
    return delta


class StandInTrainer:
    """The trainer of a simulated node: a fixed-size update after modelled compute seconds."""

    def __init__(self, index: int, dim: int, compute_s: float, speed: float) -> None:
        self.index, self.dim, self.compute_s, self.speed = index, dim, compute_s, speed

    @property
    def num_samples(self) -> int:
        return 100

    def initial_params(self) -> np.ndarray:
        return np.zeros(self.dim, dtype=np.float32)

    def fitted(self) -> dict[str, Any]:
        return {"device": "stand-in", "samples_per_s": 32 * self.speed / max(self.compute_s, 1e-3),
                "precision": "fp32"}

    def train(self, base: np.ndarray, max_steps: int = 0, time_limit_s: float = 0.0,
              server_state: Mapping[str, np.ndarray] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        seconds = self.compute_s / self.speed
        if time_limit_s > 0:
            seconds = min(seconds, time_limit_s)
        _owed[0] += seconds
        delta = shared_delta(self.dim, 0.001 * (1 + self.index % 7))
        return delta, {"samples": 32, "dataset_size": self.num_samples, "seconds": seconds, "steps": 1,
                       "samples_per_s": 32 / max(seconds, 1e-6), "train_loss": 1.0}

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        return {"loss": float(np.abs(params).mean()), "accuracy": 0.5}

    def export_model(self, params: np.ndarray, out: Path) -> list[Path]:
        raise NotImplementedError("a stand-in trainer has no model to export")


class ChurnKind(str, Enum):
    JOIN = "join"  # a node not started at the outset starts
    LEAVE = "leave"  # a node stops or is killed: its connections close at once (the kernel resets them)
    CRASH = "crash"  # a node goes silent (power, network): peers learn only from their own timeouts
    #: The first leader (not the round's root) seen taking a member's update at or after the
    #: event's time goes silent, holding that update: ``node`` is ignored.
    CRASH_LEADER = "crash_leader"


@dataclass(frozen=True)
class ChurnEvent:
    at_s: float  # modelled seconds after the job was submitted
    kind: ChurnKind
    node: int


@dataclass
class SimConfig:
    nodes: int = 16
    rounds: int = 5
    public_fraction: float = 1.0
    punchable_fraction: float = 0.5  # of the private nodes
    up_mbit: float = 20.0
    down_mbit: float = 100.0
    spread_ms: float = 80.0  # positions on a square this wide (one-way milliseconds)
    update_bytes: int = 64 * 1024
    compute_s: float = 2.0
    slow_fraction: float = 0.0  # nodes at speed 0.25
    group_size: int = 8
    seed: int = 0
    settle_s: float = 20.0  # modelled seconds between the last node start and the job
    churn: list[ChurnEvent] = field(default_factory=list)
    late: int = 0  # nodes kept back for JOIN events (the last ``late`` indices)
    time_limit_s: float = 3600.0  # modelled seconds the job may take
    drain_s: float = 5.0  # modelled seconds run after the last round, before the report
    #: Where the node homes go (a fresh folder inside, deleted after): in memory (/dev/shm) by
    #: default. A thousand nodes' ledgers of megabyte rounds (each kept with its previous copy)
    #: took 5 GB of memory there by round 4; on a disk the kernel can write them back instead.
    homes_in: str | None = None


@dataclass
class RoundFigure:
    round: int
    at_s: float
    seconds: float
    contributors: int
    busiest_bytes: int
    members: int = 0
    depth: int = 0  # levels of the plan's tree
    max_children: int = 0
    rtt_to_leader_ms: float | None = None  # mean modelled RTT of a member to its parent
    rtt_plain_ms: float | None = None  # the same, for the plain order (groups not by nearness)


class SimNode:
    """One simulated node: its identity, link model, mesh and jobs."""

    def __init__(self, index: int, identity: Identity, model: LinkModel, home: Path) -> None:
        self.index, self.identity, self.model, self.home = index, identity, model, home
        self.mesh: MeshNode | None = None
        self.jobs: JobManager | None = None
        self.events: SimEvents | None = None
        self.scope: trio.CancelScope | None = None
        self.started = trio.Event()
        self.probes: dict[bytes, float] = {}  # probe body id -> modelled time it arrived here

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    async def run(self, net: SimNetwork, bootstrap: list[str], cfg: SimConfig,
                  on_sent: Callable[[int, int, str], None] = lambda index, round_, to: None) -> None:
        events = self.events = SimEvents(partial(on_sent, self.index))
        mesh = self.mesh = MeshNode(self.identity, MeshConfig(
            listen=["/ip4/0.0.0.0/tcp/4001"], bootstrap=bootstrap, data_dir=self.home,
            bulk_channel=False, mdns=False, health=HealthConfig(),
            reachability=Reachability.PUBLIC if self.model.public else
            Reachability.RELAYED if self.model.punchable else Reachability.PRIVATE,
            bootstrap_timeout_s=60.0, transport=net), on_event=partial(emit_event, events))
        async def on_probe(msg: Inbound) -> None:
            body = msg.envelope.body
            if isinstance(body, dict) and isinstance(body.get("id"), bytes):
                self.probes.setdefault(body["id"], trio.current_time())

        # The address book stamps its entries with wall-clock time (it outlives restarts), and
        # rewrites an entry once its peer was last seen a minute before: under MockClock a
        # modelled second takes many wall seconds, so the book read the modelled wall clock
        # (the run's start plus trio's time) instead of the loaded machine's.
        mesh.book.clock = partial(modelled_wall_time, net.epoch)
        mesh.handlers.register(SIM_PROBE, on_probe)
        dim = max(1, cfg.update_bytes // 4)
        def trainer(*a: Any) -> StandInTrainer:
            return StandInTrainer(self.index, dim, cfg.compute_s, self.model.speed)

        # Deadlines cross the wire as wall-clock times (``DeadlineClock``): read off the real
        # clock, a plan's deadlines shrank by the real seconds it was in flight, which in a
        # slow simulation are many per modelled second. At 300 nodes of 10 MB updates, leaders
        # got plans whose reduce deadline had passed and closed empty on arrival.
        jobs = self.jobs = JobManager(mesh, events, self.home, trainers=trainer,
                                      clock=DeadlineClock(partial(modelled_wall_time, net.epoch)))
        with trio.CancelScope() as scope:
            self.scope = scope
            async with trio.open_nursery() as nursery:
                await nursery.start(mesh.run)
                await nursery.start(jobs.run)
                self.started.set()
                await trio.sleep_forever()


class Simulation:
    """A simulated mesh (see the module docstring); ``run`` returns the report as a dict."""

    def __init__(self, cfg: SimConfig, home: Path | None = None) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.net = SimNetwork(cfg.seed)
        # Node homes in memory where the system has it: a thousand address books and ledgers,
        # each written atomically with fsync, would otherwise time the disk, not the protocol.
        shm = Path("/dev/shm")
        if cfg.homes_in:
            Path(cfg.homes_in).mkdir(parents=True, exist_ok=True)  # the operator's folder, made if new
        self._tmp = None if home is not None else tempfile.mkdtemp(
            prefix="gpuflex-sim-", dir=cfg.homes_in or (shm if shm.is_dir() else None))
        root = home if home is not None else Path(self._tmp or ".")
        self.nodes: list[SimNode] = []
        publics = max(1, round(cfg.nodes * cfg.public_fraction))
        for i in range(cfg.nodes):
            public = i < publics
            model = LinkModel(
                public=public, punchable=not public and self.rng.random() < cfg.punchable_fraction,
                up_bps=cfg.up_mbit * 1e6 * (10 if public else 1), down_bps=cfg.down_mbit * 1e6 * (10 if public else 1),
                xy=(self.rng.random() * cfg.spread_ms, self.rng.random() * cfg.spread_ms),
                speed=0.25 if self.rng.random() < cfg.slow_fraction else 1.0)
            node = SimNode(i, Identity.generate(), model, root / f"n{i}")
            self.net.place(node.peer_id, model)
            self.nodes.append(node)
        self.by_peer = {n.peer_id: n for n in self.nodes}
        self.samples: list[dict[str, Any]] = []
        self.rounds: list[RoundFigure] = []
        self.job_id: str | None = None
        self.accepted: dict[int, list[str]] = {}  # round -> contributors of the committed result
        self.sent: dict[int, set[int]] = {}  # round -> nodes whose update a parent took
        self.takers: dict[int, dict[str, set[int]]] = {}  # round -> parent -> nodes whose update it took
        self._taken = trio.Event()  # set at each update taken (``CRASH_LEADER`` waits for one)
        self.crashed: dict[int, float] = {}  # node -> modelled time of its crash
        self.detected: dict[int, float] = {}  # node -> when every live node had it down
        self.gossip: dict[str, Any] = {}
        # CPU seconds of this process at each phase's end (start, settle, idle, gossip, rounds,
        # drain): where a simulation's cost goes, as the mesh grows.
        self.cpu: dict[str, float] = {}
        self.idle_writes: dict[str, float] = {}  # per protocol, per live node per modelled second
        self._cpu_at = time.process_time()
        self.job_span: tuple[float, float] | None = None

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _update_sent(self, index: int, round_: int, to: str) -> None:
        self.sent.setdefault(round_, set()).add(index)
        self.takers.setdefault(round_, {}).setdefault(to, set()).add(index)
        self._taken.set()

    async def _leader_holding_an_update(self) -> SimNode | None:
        """The first node that takes an update from now on while it is not its round's root."""
        by_peer = {n.peer_id: n for n in self.nodes}
        seen = {(r, p) for r, takers in self.takers.items() for p in takers}
        with trio.move_on_after(self.cfg.time_limit_s):
            while True:
                self._taken = trio.Event()
                await self._taken.wait()
                for r, takers in self.takers.items():
                    for peer in takers:
                        node = by_peer.get(peer)
                        driver = self._driver(node) if node is not None else None
                        plan = driver.book.current.plan if driver is not None else None
                        if (r, peer) not in seen and plan is not None and plan.round == r and plan.coordinator != peer:
                            return node
                        seen.add((r, peer))
        return None

    def lost_updates(self) -> dict[int, list[int]]:
        """Per committed round, the nodes still up whose update a parent took but whose
        contribution is not in the round's result (on the first live node that holds it)."""
        up = {n.index for n in self.live()}
        by_peer = {n.peer_id: n.index for n in self.nodes}
        lost: dict[int, list[int]] = {}
        for round_, senders in sorted(self.sent.items()):
            if round_ > len(self.rounds):
                continue
            holder = next((d for n in self.live()
                           if (d := self._driver(n)) is not None and d.committed >= round_), None)
            if holder is None:
                continue
            res = holder.book.ledger.results[round_ - 1]
            counted = {by_peer.get(str(c.get("peer"))) for c in res.contributors}
            missing = sorted((senders & up) - counted)
            if missing:
                lost[round_] = missing
        return lost

    def _addr(self, node: SimNode) -> str:
        host = self.net.build_host(node.identity, [], [])
        return f"/ip4/{host.ip}/tcp/4001/p2p/{node.peer_id}"

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes if n.scope is not None and not n.scope.cancel_called and n.mesh is not None]

    async def _start(self, nursery: trio.Nursery, node: SimNode) -> None:
        seeds = [n for n in self.nodes[: max(1, round(self.cfg.nodes * self.cfg.public_fraction))]
                 if n is not node and n.started.is_set()]
        boot = [self._addr(n) for n in self.rng.sample(seeds, min(3, len(seeds)))]
        nursery.start_soon(node.run, self.net, boot, self.cfg, self._update_sent)
        await node.started.wait()

    async def _sample(self) -> None:
        """Once a modelled second: every node's cumulative traffic and connections."""
        while True:
            now = trio.current_time()
            live = self.live()
            traffic = self.net.traffic
            self.samples.append({
                "t": now, "live": len(live),
                "traffic": {n.index: (t.msgs_out + t.msgs_in, t.bytes_out + t.bytes_in)
                            for n in live if (t := traffic[n.peer_id]) is not None},
                "connections": [self.net.connections(n.peer_id) for n in live],
            })
            await trio.sleep(1.0)

    async def _churn(self, nursery: trio.Nursery, t0: float) -> None:
        for ev in sorted(self.cfg.churn, key=lambda e: e.at_s):
            await trio.sleep_until(t0 + ev.at_s)
            node = self.nodes[ev.node]
            if ev.kind == ChurnKind.CRASH_LEADER:
                leader = await self._leader_holding_an_update()
                if leader is None or leader.scope is None:
                    continue
                node, ev = leader, ChurnEvent(ev.at_s, ChurnKind.CRASH, leader.index)
            if ev.kind == ChurnKind.JOIN:
                await self._start(nursery, node)
            elif node.scope is not None:
                if ev.kind == ChurnKind.CRASH:
                    self.net.crash(node.peer_id)
                self.crashed[ev.node] = trio.current_time()
                nursery.start_soon(self._watch_detection, ev.node)
                node.scope.cancel()

    async def _watch_detection(self, index: int) -> None:
        """When did every live node that knew the crashed one see it ``down``?"""
        peer = self.nodes[index].peer_id
        while True:
            knowing = [n for n in self.live() if n.mesh is not None and n.mesh.peers.get(peer) is not None]
            rec_states = [n.mesh.peers.get(peer).state for n in knowing]  # type: ignore[union-attr]
            if all(s == PeerState.DOWN for s in rec_states):
                self.detected[index] = trio.current_time() - self.crashed[index]
                return
            await trio.sleep(0.25)

    async def gossip_reach(self, wait_s: float = 10.0) -> dict[str, Any]:
        """One message gossiped from the first node: when it reached each live node, and how
        many gossip copies each node took in meanwhile (D or fewer, if the overlay holds)."""
        first = self.nodes[0]
        assert first.mesh is not None
        probe_id = self.rng.randbytes(8)
        copies: dict[str, int] = {}

        def tap(receiver: str, protocol: str, chunk: bytes) -> None:
            if protocol == GOSSIP_PROTOCOL and probe_id in chunk:
                copies[receiver] = copies.get(receiver, 0) + 1

        self.net.tap = tap
        t0 = trio.current_time()
        await first.mesh.broadcast(seal(first.identity, SIM_PROBE, {"id": probe_id, "pad": bytes(PROBE_BYTES)}))
        await trio.sleep(wait_s)
        self.net.tap = None
        live = self.live()
        arrived = sorted(n.probes[probe_id] - t0 for n in live if probe_id in n.probes)
        share = len(arrived) / max(1, len(live))
        return {"reached": round(share, 4),
                "t99_s": round(arrived[max(0, math.ceil(0.99 * len(live)) - 1)], 3) if share >= 0.99 else None,
                "t_all_s": round(arrived[-1], 3) if arrived else None,
                "max_copies_per_node": max(copies.values(), default=0),
                "mean_copies_per_node": round(sum(copies.values()) / max(1, len(live)), 2)}

    def _driver(self, node: SimNode) -> Any:
        if node.jobs is None or self.job_id is None:
            return None
        return node.jobs.drivers.get(self.job_id)

    async def _submit(self) -> None:
        first = self.nodes[0]
        assert first.mesh is not None
        cfg = self.cfg
        spec = JobSpec.from_dict({
            "model": "digits-cnn", "data": "sklearn-digits", "name": "sim", "rounds": cfg.rounds,
            "min_nodes": 2, "group_size": cfg.group_size, "strategy": "fedavg", "server_lr": 1.0,
            "train_timeout_s": max(30.0, 4 * cfg.compute_s / 0.25), "plan_timeout_s": 10.0,
            "reduce_timeout_s": 10.0})
        members = sorted({first.peer_id, *first.mesh.peers.alive()})
        frame = seal(first.identity, JOB, {"spec": spec.to_dict(), "members": members,
                                            "created": modelled_wall_time(self.net.epoch)})
        self.job_id = job_id_of(open_envelope(frame, expect_kind=JOB))
        await first.mesh.broadcast(frame)

    async def _follow_rounds(self, t0: float, say: Callable[[str], None] = lambda text: None) -> None:
        """Record each round as the first live node that has it commits it, with the plan
        in force (as the first node that has one saw it)."""
        last_t, last_bytes = t0, self._bytes_now()
        done = 0
        plans: dict[int, Any] = {}
        quiet_since = trio.current_time()
        while done < self.cfg.rounds:
            await trio.sleep(0.1)
            live = self.live()
            if trio.current_time() - quiet_since >= STALL_REPORT_S:  # a round taking long: where it is
                quiet_since = trio.current_time()
                say(f"t={quiet_since:.1f}s: round {done + 1} not committed yet; {self._where(live)}")
                say(f"  leaders still waiting: {self._waiting_on(live)}")
            for n in live[:8]:
                d = self._driver(n)
                plan = d.book.current.plan if d is not None else None
                if plan is not None:
                    if plan.round not in plans:  # what its coordinator knew as it planned
                        left = self._left_out(plan)
                        say(f"round {plan.round}'s plan (attempt {plan.attempt}): {self._leaders_of(plan)}"
                            f"{'; it leaves out ' + left if left else ''}")
                    plans[plan.round] = plan
                    break
            committed = max((d.committed for n in live if (d := self._driver(n)) is not None), default=0)
            while done < committed:
                done += 1
                now, now_bytes = trio.current_time(), self._bytes_now()
                busiest = max((b - last_bytes.get(i, 0) for i, b in now_bytes.items()), default=0)
                fig = RoundFigure(done, round(now - t0, 2), round(now - last_t, 2), self._contributors(done), busiest)
                if done in plans:
                    self._describe_plan(fig, plans[done])
                self.rounds.append(fig)
                say(f"round {done} committed at t={now:.1f}s: {fig.seconds} s, {fig.contributors} contributors")
                empty = [f"{n.peer_id[-6:]}: {text}" for n in live if n.events is not None
                         for kind, r, text in n.events.sending if kind == EventKind.REDUCE_EMPTY and r == done]
                say(f"  {self._timeline(done, last_t)}")
                if empty:  # leaders that had nothing to send, and why (``Collector.how_reported``)
                    say(f"  {len(empty)} leader(s) had nothing to send, e.g. {' | '.join(empty[:4])}")
                last_t, last_bytes, quiet_since = now, now_bytes, now

    def _timeline(self, round_: int, since: float) -> str:
        """When the live nodes reached each step of ``round_`` (the last round's model applied,
        the plan, training done, update taken, partial taken), as seconds after ``since`` (the
        last commit, or the job's submission): median / 90th percentile / last."""
        parts = []
        for kind, r in [(EventKind.ROUND_COMMITTED, round_ - 1), *((k, round_) for k in TIMELINE_KINDS[1:])]:
            ts = sorted(t - since for n in self.live() if n.events is not None
                        and (t := n.events.reached.get((kind, r))) is not None)
            if ts:
                parts.append(f"{kind.value}{'(prev)' if r < round_ else ''} {len(ts)}: "
                             f"{ts[len(ts) // 2]:.1f}/{ts[int(len(ts) * 0.9)]:.1f}/{ts[-1]:.1f}")
        def rooted(n: SimNode) -> bool:
            results = d.book.ledger.results if (d := self._driver(n)) is not None else []
            return len(results) >= round_ and results[round_ - 1].coordinator == n.peer_id

        root = next((n for n in self.live() if rooted(n)), None)
        if root is not None and root.events is not None:
            ev = root.events
            marks = {"trained": ev.reached.get((EventKind.TRAINED, round_)), "last work in": ev.last_in.get(round_),
                     "committed": ev.reached.get((EventKind.ROUND_COMMITTED, round_))}
            parts.append("the root: " + ", ".join(f"{k} {t - since:.1f}" for k, t in marks.items() if t is not None))
        return "steps (nodes: median/p90/last s after the last commit): " + "; ".join(parts)

    def _leaders_of(self, plan: Any) -> str:
        """The plan's leaders by their modelled reachability, and how its coordinator took the
        private ones' (a node nobody can dial, placed as a leader, stalls its group)."""
        leaders = {p for p in dict(plan.parent).values() if p is not None}
        kinds = Counter(self.net.models[p].kind for p in leaders)
        coord = self.by_peer.get(plan.coordinator)

        def taken(p: str) -> str:
            return str(coord.mesh.claimed_reachability(p)) if coord is not None and coord.mesh is not None else "?"

        seen = Counter(taken(p) for p in leaders if self.net.models[p].kind == "private")
        listed = set(plan.private)
        unlisted = [p for p in plan.members if not self.net.models[p].public and p not in listed]
        how = Counter(f"{self.net.models[p].kind} taken as {taken(p)}" for p in unlisted)
        return (f"leaders: {dict(kinds)}; the private ones as the coordinator took them: {dict(seen) or 'none'}; "
                f"the plan's private list {len(listed)} of {len(plan.members)}; homes not in it: "
                f"{dict(how) or 'none'}, of them leaders {len(leaders & set(unlisted))}")

    def _left_out(self, plan: Any) -> str:
        """The last round's contributors still live that ``plan`` does not name, counted by how
        its coordinator sees them (health, heard first-hand, age of their presence): a plan of
        fewer members than the round before says why."""
        live = {n.peer_id for n in self.live()}
        if plan.round > 1 and plan.round - 1 not in self.accepted:
            self._contributors(plan.round - 1)  # the commit and the next plan within one poll
        left = (set(self.accepted.get(plan.round - 1, [])) & live) - set(plan.members)
        coord = self.by_peer.get(plan.coordinator) if plan.coordinator in live else None
        d = self._driver(coord) if coord is not None else None
        if not left or coord is None or coord.mesh is None or d is None:
            return f"{len(left)} of the last round's contributors" if left else ""
        heard, now = set(coord.mesh.peers.heard()), trio.current_time()
        views: Counter[str] = Counter()
        for p in left:
            rec = coord.mesh.peers.get(p)
            seen = d.book.presence.get(p)
            views[(f"{'no record' if rec is None else rec.state}, {'heard' if p in heard else 'not heard'}, "
                   f"presence {'never' if seen is None else f'{now - seen:.0f} s old'}")] += 1
        return f"{len(left)} of the last round's contributors: " + "; ".join(
            f"{v} {k}" for k, v in views.most_common(6))

    def _waiting_on(self, live: list[SimNode], most: int = 6) -> str:
        """The open collectors of the round in force and, for each, the children that have not
        reported, with where each of those is (phase, committed rounds; gone when not live):
        a round that waits for its deadline names the children it waits for."""
        where = {n.peer_id: n for n in live}
        waits: list[str] = []
        for n in live:
            d = self._driver(n)
            if d is None:
                continue
            rs = d.book.current
            for attempt, col in rs.collectors.items():
                if col.closed or col.done.is_set():
                    continue
                missing = []
                for child in sorted(col.expected - col.reported - {n.peer_id}):
                    c = where.get(child)
                    cd = self._driver(c) if c is not None else None
                    state = ("gone" if c is None else "no job" if cd is None
                             else f"r{cd.committed} {cd.book.status.phase}")
                    sending = list(c.events.sending) if c is not None and c.events is not None else []
                    own = cd.book.current.collectors.get(attempt) if cd is not None else None
                    held = ("" if own is None else
                            f"; its collector {'closed' if own.closed else 'done' if own.done.is_set() else 'open'}, "
                            f"{len(own.expected - own.reported)} unreported, {len(own.past)} aside")
                    refusals = dict(c.mesh.inbound.refused_by) if c is not None and c.mesh is not None else {}
                    # Streams between the two now, as each side counts them (``MeshNode.in_use``): a
                    # send of the child's shows on its side from before its stream opens, and on ours
                    # only once our handler serves it.
                    if c is not None and c.mesh is not None and n.mesh is not None:
                        held += (f"; streams open: {c.mesh.streams_with(n.peer_id)} on its side, "
                                 f"{n.mesh.streams_with(child)} here; connected "
                                 f"{child in n.mesh.connected_ids()}")
                    said = " | ".join(text for *_, text in sending[-4:])
                    kind = "" if c is None else f", {c.model.kind}"
                    missing.append(f"{child[-6:]} ({state}{kind}{held}; refused {refusals or 'none'}"
                                   f"{'; ' + said if said else ''})")
                refused = dict(n.mesh.inbound.refused_by) if n.mesh is not None else {}
                told = n.events.history() if n.events is not None else []
                rejected = [e["message"][:120] for e in told if e.get("type") == EventKind.REJECTED][-1:]
                waits.append(f"{n.peer_id[-6:]} a{attempt} ({n.model.kind}; refused so far: {refused or 'none'}"
                             f"{'; last rejected: ' + rejected[0] if rejected else ''}) <- "
                             f"{', '.join(missing) or 'nobody (short of min_nodes)'}")
        return f"{len(waits)}: " + "; ".join(waits[:most]) if waits else "none"

    def _where(self, live: list[SimNode]) -> str:
        """Live nodes by (committed rounds, phase, attempt of the plan in force), most first."""
        counts: dict[str, int] = {}
        for n in live:
            d = self._driver(n)
            if d is None:
                key = "no job"
            else:
                rs, plan = d.book.current, d.book.current.plan
                key = (f"r{d.committed} {d.book.status.phase} a{rs.attempt}"
                       f"{'' if plan is None else f' plan a{plan.attempt} by {plan.coordinator[-6:]}'}")
            counts[key] = counts.get(key, 0) + 1
        return "; ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:6])

    def _describe_plan(self, fig: RoundFigure, plan: Any) -> None:
        """The plan's tree: size, depth, widest fan-in, and its members' mean modelled RTT to
        their parent, beside the same for the plain member order on the same members."""
        from aggregation.tree import build_tree, depth
        from gpuflex.node.core.placement import order_for_tree

        parent = dict(plan.parent)
        kids: dict[str, int] = {}
        for p in parent.values():
            if p is not None:
                kids[p] = kids.get(p, 0) + 1
        fig.members, fig.depth, fig.max_children = len(parent), depth(parent), max(kids.values(), default=0)

        def mean_rtt(tree: dict[str, str | None]) -> float | None:
            pairs = [(m, p) for m, p in tree.items() if p is not None]
            return round(sum(self.net.rtt_ms(m, p) for m, p in pairs) / len(pairs), 1) if pairs else None

        fig.rtt_to_leader_ms = mean_rtt(parent)
        private = set(plan.private)
        plain, size = order_for_tree(plan.coordinator, list(plan.members), private, self.cfg.group_size,
                                     punched={p for p in private if self.net.models[p].punchable})
        fig.rtt_plain_ms = mean_rtt(build_tree(plain, size, plan.coordinator))

    def _contributors(self, round_: int) -> int:
        for n in self.live():
            d = self._driver(n)
            if d is not None and len(d.book.ledger.results) >= round_:
                res = d.book.ledger.results[round_ - 1]
                self.accepted[round_] = [str(c.get("peer")) for c in res.contributors]
                return len(res.contributors)
        return 0

    def _bytes_now(self) -> dict[int, int]:
        return {n.index: self.net.traffic[n.peer_id].bytes_in + self.net.traffic[n.peer_id].bytes_out
                for n in self.nodes}

    async def run(self, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        say = progress or (lambda text: None)
        cfg = self.cfg
        self._cpu_at = time.process_time()
        with inline_threads():
            async with trio.open_nursery() as nursery:
                starting = self.nodes[: cfg.nodes - cfg.late]
                wave = max(8, int(math.sqrt(len(starting))))
                for at in range(0, len(starting), wave):
                    async with trio.open_nursery() as batch:
                        for node in starting[at: at + wave]:
                            batch.start_soon(self._start, nursery, node)
                    say(f"started {min(at + wave, len(starting))}/{len(starting)} nodes "
                        f"at t={trio.current_time():.1f}s")
                    await trio.sleep(1.0)
                self._cpu_mark("start")
                nursery.start_soon(self._sample)
                await trio.sleep(cfg.settle_s)
                self._cpu_mark("settle")
                idle_from = trio.current_time()
                writes_from = dict(self.net.writes_by_protocol)
                await trio.sleep(min(10.0, cfg.settle_s))
                idle_to = trio.current_time()
                span = max(idle_to - idle_from, 1e-9) * max(1, len(self.live()))
                self.idle_writes = {p: round((n - writes_from.get(p, 0)) / span, 2)
                                    for p, n in self.net.writes_by_protocol.most_common()}
                self._cpu_mark("idle")
                idle = self._rates(idle_from, idle_to)
                conns = self.samples[-1]["connections"] if self.samples else [0]
                say(f"idle: {idle['msgs']:.1f} msgs/s, {idle['bytes'] / 1e3:.1f} kB/s per node; "
                    f"{sum(conns) / max(1, len(conns)):.0f} connections per node (most {max(conns)})")
                self.gossip = await self.gossip_reach()
                self._cpu_mark("gossip")
                say(f"gossip reach: {self.gossip}")
                t0 = trio.current_time()
                await self._submit()
                say(f"job submitted at t={t0:.1f}s")
                nursery.start_soon(self._churn, nursery, t0)
                with trio.move_on_after(cfg.time_limit_s):
                    await self._follow_rounds(t0, say)
                self._cpu_mark("rounds")
                self.job_span = (t0, trio.current_time())
                say(f"{len(self.rounds)} rounds committed at t={trio.current_time():.1f}s; CPU s by phase {self.cpu}")
                await trio.sleep(cfg.drain_s)  # the last result reaches the other nodes
                self._cpu_mark("drain")
                report = self.report(idle_from, idle_to)
                nursery.cancel_scope.cancel()
        return report

    def _cpu_mark(self, phase: str) -> None:
        """CPU seconds this process spent in ``phase``, since the previous mark."""
        now = time.process_time()
        self.cpu[phase] = round(now - self._cpu_at, 1)
        self._cpu_at = now

    def _rates(self, t_from: float, t_to: float) -> dict[str, float]:
        """Messages and bytes per live node per modelled second between two samples."""
        a = min(self.samples, key=lambda s: abs(s["t"] - t_from))
        b = min(self.samples, key=lambda s: abs(s["t"] - t_to))
        span = max(b["t"] - a["t"], 1e-9)
        both = [i for i in b["traffic"] if i in a["traffic"]]
        if not both:
            return {"msgs": 0.0, "bytes": 0.0, "max_msgs": 0.0, "max_bytes": 0.0}
        msgs = [(b["traffic"][i][0] - a["traffic"][i][0]) / span for i in both]
        byts = [(b["traffic"][i][1] - a["traffic"][i][1]) / span for i in both]
        return {"msgs": sum(msgs) / len(both), "bytes": sum(byts) / len(both),
                "max_msgs": max(msgs), "max_bytes": max(byts)}

    def _connections_at(self, t: float) -> dict[str, float]:
        sample = min(self.samples, key=lambda x: abs(x["t"] - t)) if self.samples else {"connections": [0]}
        conns = sample["connections"] or [0]
        return {"mean": sum(conns) / len(conns), "max": max(conns)}

    def report(self, idle_from: float, idle_to: float) -> dict[str, Any]:
        last = self.samples[-1] if self.samples else {"connections": [0]}
        alive_view = [len(n.mesh.peers.alive()) for n in self.live() if n.mesh is not None] or [0]
        return {
            "nodes": self.cfg.nodes, "rounds_wanted": self.cfg.rounds, "rounds_committed": len(self.rounds),
            "idle_per_node_s": self._rates(idle_from, idle_to),
            # Which protocols the idle upkeep is: stream writes per live node per modelled second.
            "idle_writes_by_protocol": self.idle_writes,
            # The same while the job ran (submission to the last round): what being in a job costs.
            "job_per_node_s": self._rates(*self.job_span) if self.job_span else None,
            "connections_per_node": {"mean": sum(last["connections"]) / max(1, len(last["connections"])),
                                     "max": max(last["connections"] or [0])},
            # The same while idle (before the job): a round's coordinators are reached by every
            # member's presence, so during a job they hold far more for a while.
            "idle_connections_per_node": self._connections_at(idle_to),
            "alive_view_mean": sum(alive_view) / len(alive_view),
            "rounds": [r.__dict__ for r in self.rounds],
            "detection_s": {str(k): round(v, 2) for k, v in self.detected.items()},
            "crashed_undetected": [k for k in self.crashed if k not in self.detected],
            # Accepted updates of nodes still up that no committed result counts (none, if
            # every update a parent took survives the churn).
            "lost_updates": {str(r): nodes for r, nodes in self.lost_updates().items()},
            "gossip": self.gossip,
            "cpu_s_by_phase": dict(self.cpu),
        }


def run_simulation(cfg: SimConfig) -> tuple[Simulation, dict[str, Any]]:
    """Run ``cfg`` to its report in modelled time (``MockClock``, the cycle collector quiet),
    and return the simulation, closed (its homes deleted), for checks its report leaves out."""
    import trio.testing

    sim = Simulation(cfg)

    async def main() -> dict[str, Any]:
        return await sim.run()

    try:
        with quiet_gc():
            report = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        sim.close()
    return sim, report


@asynccontextmanager
async def simulation(cfg: SimConfig) -> AsyncIterator[Simulation]:
    sim = Simulation(cfg)
    try:
        yield sim
    finally:
        sim.close()
