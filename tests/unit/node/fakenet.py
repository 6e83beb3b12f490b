"""An in-process stand-in for the mesh, for unit tests of the round protocol only.

Every node is a real ``JobDriver`` with its real roles, ledger, signatures and aggregation;
what is fake is the node around it: ``FakePort`` implements ``JobPort`` by handing messages
straight to the other drivers (after a chosen delay), blobs live in memory, peer health is
decided by the test (a killed node turns ``down`` for everyone after ``detect_s``), training
is a deterministic numpy function, and blocking work runs inline. Run under
``trio.testing.MockClock(autojump_threshold=0)``, a round takes no real time.

This is a fake transport for one layer: it never stands in for the mesh in a test that
claims end-to-end behaviour (those start real processes: tests/integration).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import trio

from aggregation.fednova import fednova_mean
from aggregation.tree import build_tree
from gpuflex.jobspec import JobSpec
from gpuflex.node.clock import DeadlineClock
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.core.ledger import verify_chain
from gpuflex.node.core.messages import JOB, PARTIAL, UPDATE, Result, parse_partial, parse_update
from gpuflex.node.core.modelblob import unpack_model
from gpuflex.node.core.ranking import coordinator_ranking
from gpuflex.node.core.workplan import norm_of
from gpuflex.node.driver import JobDriver
from gpuflex.node.presence import JobPresence
from gpuflex.node.state import JobInfo
from mesh.blob import BlobError, BlobNotFound, blob_hash
from mesh.codec import ReplayGuard, WireError, open_envelope, seal
from mesh.health import PeerState
from mesh.identity import Identity
from mesh.messaging import Inbound, Rejected, SendError

T = TypeVar("T")
DIM = 6  # parameters of the fake model
BATCH = 32  # samples per step of the fake trainer (the default batch_size of a job)
#: Presence is refreshed this often, as JobManager does.
PRESENCE_EVERY_S = 3.0
PRESENCE_SOON_S = 0.2
#: The fake wall clock's origin: fixed, so a run is repeatable.
EPOCH = 1.7e9


def fast_spec(**overrides: Any) -> JobSpec:
    """The demo job's settings with short, explicit timeouts."""
    data: dict[str, Any] = {"model": "digits-cnn", "data": "sklearn-digits", "name": "unit", "rounds": 2,
                            "min_nodes": 2, "group_size": 4, "plan_timeout_s": 3.0, "train_timeout_s": 12.0,
                            "reduce_timeout_s": 2.0, "strategy": "fedavg", "server_lr": 1.0}
    data.update(overrides)
    return JobSpec.from_dict(data)


class FakeTrainer:
    """A deterministic stand-in for a Workload: node ``index`` always moves the model the same
    way from the same base, so a test can recompute every committed model.

    Speed is the node's: with a ``rate`` (samples per mock second) it trains as many steps of
    ``BATCH`` samples as its plan and time limit allow, and a training takes those steps' time;
    without one, ``1 + index % 4`` steps in ``train_s``. The delta grows with the steps taken.
    """

    def __init__(self, index: int, node: FakeNode | None = None) -> None:
        self.index = index
        self.node = node

    @property
    def num_samples(self) -> int:
        return 10 + 3 * self.index

    def initial_params(self) -> np.ndarray:
        return np.linspace(-1.0, 1.0, DIM, dtype=np.float32)

    def fitted(self) -> dict[str, Any]:
        rate = self.node.rate if self.node is not None else 0.0
        return {"device": f"fake{self.index}", "samples_per_s": rate, "precision": "fp32"}

    def train(self, base: np.ndarray, max_steps: int = 0,
              time_limit_s: float = 0.0) -> tuple[np.ndarray, dict[str, Any]]:
        rate = self.node.rate if self.node is not None else 0.0
        if rate > 0 and time_limit_s > 0:
            fits = int(time_limit_s * rate // BATCH)
            steps = max(1, min(max_steps, fits) if max_steps else fits)
            seconds = steps * BATCH / rate
        else:
            steps = 1 + self.index % 4
            seconds = self.node.train_s if self.node is not None else 0.01
        return delta_of(self.index, base, steps), {
            "samples": steps * BATCH, "dataset_size": self.num_samples, "seconds": seconds, "steps": steps,
            "samples_per_s": steps * BATCH / seconds if seconds > 0 else 0.0, "train_loss": 1.0 / (1 + self.index)}

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        return {"loss": float(np.linalg.norm(params)), "accuracy": 0.5}

    def export_model(self, params: np.ndarray, out: Path) -> list[Path]:
        raise NotImplementedError


def delta_of(index: int, base: np.ndarray, steps: int = 1) -> np.ndarray:
    rng = np.random.default_rng(index)
    return ((rng.normal(size=DIM) * 0.1 + 0.01 * base) * steps).astype(np.float32)


class MemBlobs:
    """A node's blob store in memory; every blob also goes to the net's archive, which the
    tests read (pruning deletes old models from the nodes themselves)."""

    def __init__(self, archive: dict[str, bytes]) -> None:
        self.data: dict[str, bytes] = {}
        self.archive = archive

    def put(self, data: bytes | memoryview) -> str:
        digest = blob_hash(data)
        self.data[digest] = self.archive[digest] = bytes(data)
        return digest

    def put_parts(self, parts: Sequence[bytes | memoryview]) -> str:
        return self.put(b"".join(parts))

    def read(self, digest: str, verify: bool = True) -> bytes:
        if digest not in self.data:
            raise BlobError(f"no blob {digest[:12]}")
        return self.data[digest]

    def has(self, digest: str) -> bool:
        return digest in self.data

    def size(self, digest: str) -> int:
        return len(self.read(digest))

    def discard(self, digest: str) -> bool:
        return self.data.pop(digest, None) is not None


@dataclass
class Event:
    at: float  # mock time
    kind: EventKind
    round: int | None
    peer: str | None
    message: str


@dataclass
class FakeNode:
    index: int
    identity: Identity
    home: Path
    blobs: MemBlobs
    driver: JobDriver | None = None
    alive: bool = False
    ip: str = "127.0.0.1"  # the address peers see it connect from (the per-network cap counts it)
    down: bool = False  # what every other node's health says
    train_s: float = 0.0  # mock seconds each local training takes
    rate: float = 0.0  # samples per mock second (time-budgeted rounds); 0: train_s decides
    train_delays: list[float] = field(default_factory=list)  # the next trainings' own durations
    prepare_s: float = 0.0  # mock seconds fitting the job to its device takes (loading, probing)
    events: list[Event] = field(default_factory=list)
    penalties: dict[str, int] = field(default_factory=dict)
    credits: dict[str, int] = field(default_factory=dict)
    replay: ReplayGuard = field(default_factory=ReplayGuard)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    nursery: trio.Nursery | None = None

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def kinds(self) -> list[EventKind]:
        return [e.kind for e in self.events]


class FakePort:
    """One node's ``JobPort`` on the fake network."""

    def __init__(self, net: FakeNet, node: FakeNode) -> None:
        self.net, self.node = net, node
        self._clock = DeadlineClock(wall=net.wall)

    @property
    def identity(self) -> Identity:
        return self.node.identity

    @property
    def home(self) -> Path:
        return self.node.home

    @property
    def blobs(self) -> MemBlobs:
        return self.node.blobs

    @property
    def clock(self) -> DeadlineClock:
        return self._clock

    async def request(self, peer: str, frame: bytes, payload: bytes | None = None, timeout: float = 30.0) -> Any:
        with trio.move_on_after(timeout) as scope:
            return await self.net.deliver(self.node, peer, frame, payload)
        assert scope.cancelled_caught
        raise SendError(f"peer {peer[-8:]} did not answer within {timeout:.0f}s")

    async def broadcast(self, frame: bytes) -> int:
        return await self.net.broadcast(self.node, frame)

    async def fetch_blob(self, digest: str, providers: Sequence[str] = (), timeout: float = 120.0,
                         max_size: int | None = None) -> object:
        if self.node.blobs.has(digest):
            return digest
        strict = self.net.providers_only and providers
        for peer in [*providers] if strict else [*providers, *self.net.ids()]:
            other = self.net.nodes.get(peer)
            if other is not None and other is not self.node and self.net.reachable(self.node, other) \
                    and other.blobs.has(digest):
                if max_size is not None and len(other.blobs.read(digest)) > max_size:
                    continue  # as the mesh refuses a blob announced over what the job expects
                await trio.sleep(self.net.delay(self.node, other))
                self.node.blobs.put(other.blobs.read(digest))
                self.net.served.append((digest, other.peer_id, self.node.peer_id))
                return digest
        if strict:  # as the mesh answers when every provider asked holds none
            raise BlobNotFound(f"could not fetch blob {digest[:16]}: not found")
        raise BlobError(f"could not fetch blob {digest[:16]}: no peer has it")

    async def announce_blob(self, digest: str) -> None:
        self.net.announced.append((digest, self.node.peer_id))

    def heard_peers(self) -> list[str]:
        return [p for p in self.net.order if p != self.node.peer_id and self.health(p) == PeerState.UP]

    async def reach(self, peers: Sequence[str]) -> None:
        return None  # the fake net's peers are heard as long as they are up

    def health(self, peer: str) -> PeerState | None:
        """Never-started nodes are unknown; a killed one is up until ``detect_s`` has passed."""
        other = self.net.nodes.get(peer)
        me = self.node.peer_id
        if other is None or other.driver is None or peer in self.net.unknown.get(me, ()) \
                or peer in self.net.unrecorded.get(me, ()):
            return None
        return PeerState.DOWN if other.down or self.net.cut(self.node, other) else PeerState.UP

    def behind_nat(self, peer: str) -> bool:
        return peer in self.private_peers()

    def private_peers(self) -> set[str]:
        """The nodes the test put behind NAT (``FakeNet.private``), as this node knows them: a
        node in ``FakeNet.stale_claims`` knows only of itself (the others' NodeInfo it holds
        predates their reachability, as a home's does that learnt its peers before any of them
        found out it is relayed)."""
        me = self.node.peer_id
        return self.net.private & {me} if me in self.net.stale_claims else set(self.net.private)

    def coordinates(self) -> dict[str, Any]:
        return {}  # no network coordinates: groups in the plain order

    def punched_peers(self) -> set[str]:
        return set()

    def reach_unknown(self, peers: Any) -> set[str]:
        """Of ``peers``, the ``FakeNet.unclaimed`` ones (this node aside): no word of their
        reachability reached this node."""
        return (set(peers) & self.net.unclaimed) - {self.node.peer_id}

    def why_unreachable(self, peer: str) -> str:
        return ""

    def peer_ip(self, peer: str) -> str | None:
        other = self.net.nodes.get(peer)
        return None if other is None else other.ip

    def emit(self, kind: EventKind, round_: int | None = None, peer: str | None = None,
             message: str = "", **extra: Any) -> None:
        self.node.events.append(Event(trio.current_time(), kind, round_, peer, message))

    def penalise(self, peer: str) -> None:
        self.node.penalties[peer] = self.node.penalties.get(peer, 0) + 1

    def credit(self, peer: str) -> None:
        self.node.credits[peer] = self.node.credits.get(peer, 0) + 1

    def blobs_in_use(self) -> set[str]:
        return self.node.driver.recent_blobs() if self.node.driver else set()

    def announce_soon(self) -> None:
        self.net.announce_soon()

    async def catch_up(self, prefer: Sequence[str] = ()) -> None:
        await self.net.sync(self.node, prefer)

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        result = fn(*args)
        if getattr(fn, "__name__", "") == "fitted":
            await trio.sleep(self.node.prepare_s)
        if getattr(fn, "__name__", "") == "train":
            node = self.node
            took = result[1]["seconds"]  # type: ignore[index]
            await trio.sleep(node.train_delays.pop(0) if node.train_delays else took)
        await trio.sleep(0)
        return result


class FakeNet:
    """``size`` nodes of one job; ``start()`` runs the first ``count`` of them."""

    def __init__(self, tmp: Path, size: int, spec: JobSpec, *, initial: int | None = None, detect_s: float = 4.0,
                 jitter: Callable[[FakeNode, FakeNode], float] | None = None) -> None:
        """``initial``: how many nodes the job names as members (the rest join late)."""
        self.spec = spec
        self.detect_s = detect_s  # how long after a death every node's health says down
        self.jitter = jitter or (lambda a, b: 0.01)
        self.epoch = EPOCH
        self.partition: list[set[str]] | None = None
        self.acks: list[tuple[int, int, str, str]] = []  # (round, attempt, member, acceptor) of updates
        self.forwarded: set[tuple[int, int, str]] = set()  # (round, attempt, leader) of delivered partials
        self.roots: dict[tuple[int, int], str] = {}  # (round, attempt) -> the plan's root
        self.private: set[str] = set()  # nodes behind NAT (none by default)
        self.stale_claims: set[str] = set()  # nodes that know no other node's reachability
        self.unclaimed: set[str] = set()  # nodes whose reachability no other node has word of
        self.presence_cut: set[frozenset[str]] = set()  # pairs of nodes whose presence never arrives
        self.pair_cuts: set[frozenset[str]] = set()  # pairs of nodes cut from each other alone
        #: (sender, receiver) pairs whose requests fail although each sees the other up: a
        #: stream that breaks while a relayed link is re-established.
        self.lost_sends: set[tuple[str, str]] = set()
        # (sender, receiver): the message is handled there, but the sender sees its stream reset.
        self.lost_replies: set[tuple[str, str]] = set()
        #: Per node, the peers it keeps no record of (health None, as a large mesh's node for
        #: most peers), until their presence reaches it.
        self.unknown: dict[str, set[str]] = {}
        #: Per node, the peers it keeps no record of even once they speak to it (health None
        #: for good): a large mesh's node whose peer table is full of others.
        self.unrecorded: dict[str, set[str]] = {}
        self.presence_every_s = PRESENCE_EVERY_S  # the presence period (announce_soon sends sooner)
        #: Blob fetches: only from the providers named, as the mesh does (else from anyone).
        self.providers_only = False
        self.served: list[tuple[str, str, str]] = []  # (digest, server, fetcher) of every blob fetched
        self.announced: list[tuple[str, str]] = []  # (digest, node) of every provider record made
        ids = [Identity(bytes([i + 1]) * 32) for i in range(size)]
        self.archive: dict[str, bytes] = {}
        self.nodes: dict[str, FakeNode] = {
            ident.peer_id: FakeNode(i, ident, tmp / f"node{i}", MemBlobs(self.archive)) for i, ident in enumerate(ids)}
        self.order = [ident.peer_id for ident in ids]
        members = self.order[: size if initial is None else initial]
        owner = self.nodes[members[0]].identity
        frame = seal(owner, JOB, {"spec": spec.to_dict(), "members": members, "created": 0})
        self.info = JobInfo(job_id=open_envelope(frame).digest[:16], spec=spec,
                            initial_members=tuple(sorted(members)), frame=frame, submitted_by=owner.peer_id)
        self._nursery: trio.Nursery | None = None
        self._presence_due = trio.Event()

    # -- set-up ----------------------------------------------------------------------------------

    def wall(self) -> float:
        """The wall clock every fake node shares: tied to trio's (mock) clock."""
        return self.epoch + trio.current_time()

    def ids(self) -> list[str]:
        return list(self.order)

    def node(self, i: int) -> FakeNode:
        return self.nodes[self.order[i]]

    async def start(self, nursery: trio.Nursery, count: int | None = None, hold: Sequence[int] = ()) -> None:
        """Start the first ``count`` nodes; those in ``hold`` are up (peers see them) but do
        not run the job until ``release``: a coordinator that hangs before planning."""
        self._nursery = nursery
        members = self.order[: len(self.order) if count is None else count]
        for peer in members:  # every node is up before any starts the job
            self._make(self.nodes[peer])
        held = {self.order[i] for i in hold}
        for peer in members:
            if peer not in held:
                await nursery.start(self._run, self.nodes[peer])
        nursery.start_soon(self._presence_loop)

    def _make(self, node: FakeNode) -> None:
        node.home.mkdir(parents=True, exist_ok=True)
        node.driver = JobDriver(self.info, FakePort(self, node), node.home / "jobs",
                                trainers=lambda spec, index, parts, home, hook, n=node: FakeTrainer(n.index, n))
        node.alive = True

    async def join(self, node: FakeNode) -> None:
        """Start ``node`` late: it learnt of the job from a peer, as a sync would bring it."""
        assert self._nursery is not None
        self._make(node)
        await self._nursery.start(self._run, node)
        self._health_changed()  # a new peer coming up is a health change

    async def _run(self, node: FakeNode, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with node.scope:
            async with trio.open_nursery() as nursery:
                node.nursery = nursery
                task_status.started()
                assert node.driver is not None
                await node.driver.run()
                await trio.sleep_forever()  # keep serving peers after the job is done

    def kill(self, node: FakeNode) -> None:
        """SIGKILL: the node stops at once; everyone's health says so ``detect_s`` later."""
        node.alive = False
        node.scope.cancel()
        assert self._nursery is not None
        self._nursery.start_soon(self._detect, node)

    async def _detect(self, node: FakeNode) -> None:
        await trio.sleep(self.detect_s)
        node.down = True
        self._health_changed()

    def _health_changed(self) -> None:
        for other in self.nodes.values():
            if other.driver is not None and other.alive:
                other.driver.notify()

    def split(self, *sides: Sequence[int]) -> None:
        """Cut the network between ``sides``: health across the cut says down at once."""
        self.partition = [{self.order[i] for i in side} for side in sides]
        self._health_changed()

    def heal(self) -> None:
        self.partition = None
        self._health_changed()

    def cut(self, a: FakeNode, b: FakeNode) -> bool:
        if frozenset((a.peer_id, b.peer_id)) in self.pair_cuts:
            return True
        if self.partition is None:
            return False
        return not any(a.peer_id in side and b.peer_id in side for side in self.partition)

    def reachable(self, a: FakeNode, b: FakeNode) -> bool:
        return b.alive and not self.cut(a, b)

    def delay(self, a: FakeNode, b: FakeNode) -> float:
        return max(0.0, self.jitter(a, b))

    # -- the mesh verbs ----------------------------------------------------------------------------

    async def deliver(self, src: FakeNode, peer: str, frame: bytes, payload: bytes | None) -> Any:
        dst = self.nodes.get(peer)
        if dst is None or dst is src:
            raise SendError(f"cannot send to {peer[-8:]}")
        await trio.sleep(self.delay(src, dst))
        if not self.reachable(src, dst) or dst.nursery is None or dst.driver is None:
            raise SendError(f"peer {peer[-8:]}: connection refused")
        if (src.peer_id, peer) in self.lost_sends:
            raise SendError(f"peer {peer[-8:]}: stream reset")
        self.unknown.get(peer, set()).discard(src.peer_id)  # it heard the sender over its connection
        try:
            env = open_envelope(frame, replay=dst.replay)
        except WireError as exc:
            raise SendError(f"peer {peer[-8:]}: {exc}") from None
        box: dict[str, Any] = {}
        done = trio.Event()

        async def handle() -> None:
            try:
                assert dst.driver is not None
                box["reply"] = await dst.driver.handle(Inbound(env, payload, src.peer_id, gossip=False))
            except Rejected as exc:
                box["error"] = exc
            except WireError as exc:
                dst.penalties[src.peer_id] = dst.penalties.get(src.peer_id, 0) + 1
                box["error"] = exc
            finally:
                done.set()

        dst.nursery.start_soon(handle)
        await done.wait()
        if "reply" not in box:
            raise SendError(f"peer {peer[-8:]} refused the message: {box.get('error', 'it died')}")
        if env.kind == UPDATE:
            up = parse_update(env)
            rs = dst.driver.book.current
            attempt = rs.plan.attempt if rs.plan is not None and rs.round == up.round else -1
            self.acks.append((up.round, attempt, up.peer, dst.peer_id))
            if rs.plan is not None:
                self.roots[(up.round, attempt)] = rs.plan.coordinator
        elif env.kind == PARTIAL:
            part = parse_partial(env)
            self.forwarded.add((part.round, part.attempt, part.leader))
        if (src.peer_id, peer) in self.lost_replies:
            raise SendError(f"peer {peer[-8:]}: stream reset before the reply")
        return box["reply"]

    async def broadcast(self, src: FakeNode, frame: bytes) -> int:
        env = open_envelope(frame)
        assert src.driver is not None
        with contextlib.suppress(Rejected):  # applied here first, as the mesh does
            await src.driver.handle(Inbound(env, None, src.peer_id, gossip=True))
        targets = [n for n in self.nodes.values() if n is not src and self.reachable(src, n)]
        assert self._nursery is not None
        for dst in targets:
            self._nursery.start_soon(self._gossip, src, dst, env)
        return len(targets)

    async def _gossip(self, src: FakeNode, dst: FakeNode, env: Any) -> None:
        await trio.sleep(self.delay(src, dst))
        if not self.reachable(src, dst) or dst.nursery is None or dst.driver is None:
            return
        driver = dst.driver

        async def handle() -> None:
            with contextlib.suppress(Rejected, WireError):
                await driver.handle(Inbound(env, None, src.peer_id, gossip=True))

        dst.nursery.start_soon(handle)

    async def sync(self, node: FakeNode, prefer: Sequence[str] = ()) -> None:
        """What JobManager.sync_from_peers does for one job: adopt a peer's ledger."""
        for peer in [*prefer, *(p for p in self.order if p not in prefer)][:4]:
            other = self.nodes.get(peer)
            if other is None or other is node or not self.reachable(node, other) or other.driver is None:
                continue
            await trio.sleep(self.delay(node, other))
            assert node.driver is not None
            await node.driver.offer_ledger(list(other.driver.book.ledger.frames), peer)
            return

    async def _presence_loop(self) -> None:
        """Every node tells every reachable node it takes part, and how far it is."""
        while True:
            for src in list(self.nodes.values()):
                if not src.alive or src.driver is None:
                    continue
                for dst in self.nodes.values():
                    if dst is src or not self.reachable(src, dst) or dst.driver is None or dst.nursery is None \
                            or frozenset((src.peer_id, dst.peer_id)) in self.presence_cut:
                        continue
                    self.unknown.get(dst.peer_id, set()).discard(src.peer_id)
                    seen = JobPresence.from_wire(src.driver.committed, src.driver.head(), src.driver.throughput(),
                                                 src.driver.weight, preparing=src.driver.preparing,
                                                 passes=src.driver.passes_round)
                    if dst.driver.saw_presence(src.peer_id, seen, failed=src.driver.failure):
                        dst.nursery.start_soon(self.sync, dst, [src.peer_id])
            with trio.move_on_after(self.presence_every_s):  # or sooner, when a node asks (announce_soon)
                await self._presence_due.wait()
                await trio.sleep(PRESENCE_SOON_S)
            self._presence_due = trio.Event()

    def announce_soon(self) -> None:
        self._presence_due.set()

    # -- what the tests check ----------------------------------------------------------------------

    def dump(self) -> str:
        """Every node's events, for an assertion message."""
        events = sorted(((e.at, n.index, e) for n in self.nodes.values() for e in n.events), key=lambda t: t[:2])
        return "\n".join(f"{at:7.2f} node {i} {e.kind} r{e.round}: {e.message}" for at, i, e in events)

    def alive_nodes(self) -> list[FakeNode]:
        return [n for n in self.nodes.values() if n.alive and n.driver is not None]

    def ledger(self, node: FakeNode) -> list[bytes]:
        assert node.driver is not None
        return list(node.driver.book.ledger.frames)

    def ranking(self, round_: int = 1, attempt: int = 0) -> list[FakeNode]:
        """The coordinator ranking every node computes for ``round_``."""
        ranked = coordinator_ranking(self.info.job_id, round_, self.info.initial_members, (), attempt,
                                     first=self.info.submitted_by if round_ == 1 else None)
        return [self.nodes[p] for p in ranked]

    def first_tree(self) -> dict[str, str | None]:
        """The group tree round 1's first-ranked coordinator will plan with every node up."""
        root = self.ranking()[0].peer_id
        members = [root] + [p for p in sorted(self.info.initial_members) if p != root]
        return build_tree(members, self.spec.group_size, root)

    async def wait_until(self, predicate: Callable[[], bool], limit: float = 300.0) -> None:
        """Poll in small mock-time steps, so a test can act at a precise protocol point."""
        with trio.fail_after(limit):
            while not predicate():
                await trio.sleep(0.05)

    async def wait_rounds(self, rounds: int, nodes: Sequence[FakeNode] | None = None, limit: float = 600.0) -> None:
        """Until every node given (the live ones by default) has committed ``rounds`` rounds."""
        with trio.fail_after(limit):
            while True:
                watch = list(nodes) if nodes is not None else self.alive_nodes()
                if all(n.driver is not None and n.driver.committed >= rounds for n in watch):
                    return
                await trio.sleep(0.5)

    async def run_rounds(self, rounds: int) -> list[Result]:
        """Start every node, stop once each has committed ``rounds`` rounds, and return the
        verified results of the one ledger every live node holds."""
        async with trio.open_nursery() as nursery:
            await self.start(nursery)
            await self.wait_rounds(rounds)
            nursery.cancel_scope.cancel()
        frames = [self.ledger(n) for n in self.alive_nodes()]
        assert all(f == frames[0] for f in frames), "ledgers differ between nodes"
        return verify_chain(frames[0], self.info.job_id)

    def expected_model(self, node: FakeNode, round_: int) -> np.ndarray:
        """Round ``round_``'s model as the flat aggregate of its contributors' deltas: their
        sample-weighted FedAvg, or under FedNova the step-normalised formula."""
        assert node.driver is not None
        results = node.driver.book.ledger.results
        base = unpack_model(self.archive[results[round_ - 2].model_hash])[0] if round_ > 1 else \
            FakeTrainer(0).initial_params()
        res = results[round_ - 1]
        deltas, weights, norms = [], [], []
        for c in res.contributors:
            index = self.nodes[c["peer"]].index
            deltas.append(delta_of(index, base, c["steps"]).astype(np.float64))
            weights.append(float(c["samples"]))
            norms.append(norm_of(self.spec, c["steps"]))
        if self.spec.uses_fednova:
            return (base + fednova_mean(deltas, weights, norms)).astype(np.float32)
        return (base + np.average(deltas, axis=0, weights=weights)).astype(np.float32)

    def committed_model(self, node: FakeNode, round_: int) -> np.ndarray:
        assert node.driver is not None
        return unpack_model(self.archive[node.driver.book.ledger.results[round_ - 1].model_hash])[0]


def jittered(seed: int, low: float = 0.0, high: float = 0.5) -> Callable[[FakeNode, FakeNode], float]:
    """Per-message delays drawn from a seeded generator: a random but repeatable message order."""
    rng = random.Random(seed)
    return lambda a, b: rng.uniform(low, high)
