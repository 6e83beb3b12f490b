"""The real ``JobPort``: one job's view of the node, over its MeshNode and event log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from gpuflex.node.clock import DeadlineClock
from gpuflex.node.core.kinds import EventKind
from gpuflex.node.crashmark import CrashMarks
from gpuflex.node.events import EventLog
from gpuflex.node.port import FETCH_TIMEOUT_S, REQUEST_TIMEOUT_S, BlobStorePort
from mesh.health import PeerState
from mesh.identity import Identity
from mesh.node import MeshNode
from mesh.reachability import BEHIND_NAT, Reachability
from mesh.vivaldi import Coordinate

T = TypeVar("T")
#: One fault scored against a peer that sent a job bad input.
PENALTY_POINTS = 1.0


@dataclass(frozen=True)
class NodeServices:
    """What the job manager offers every job, as plain callbacks."""

    credit: Callable[[str], None]
    blobs_in_use: Callable[[], set[str]]
    announce_soon: Callable[[], None]
    catch_up: Callable[[Sequence[str]], Awaitable[None]]


class NodePort:
    def __init__(self, mesh: MeshNode, events: EventLog, home: Path, job_id: str, services: NodeServices,
                 clock: DeadlineClock | None = None, marks: CrashMarks | None = None) -> None:
        """``marks``: for a job that runs plug-in code, where that code is marked as running."""
        self._mesh, self._events, self._job_id, self._services = mesh, events, job_id, services
        self._marks = marks
        self._home = home
        self._clock = clock or DeadlineClock()

    @property
    def identity(self) -> Identity:
        return self._mesh.identity

    @property
    def home(self) -> Path:
        return self._home

    @property
    def blobs(self) -> BlobStorePort:
        return self._mesh.blobs

    @property
    def clock(self) -> DeadlineClock:
        return self._clock

    async def request(self, peer: str, frame: bytes, payload: bytes | None = None,
                      timeout: float = REQUEST_TIMEOUT_S) -> Any:
        return await self._mesh.request(peer, frame, payload, timeout=timeout)

    async def broadcast(self, frame: bytes) -> int:
        return await self._mesh.broadcast(frame)

    async def fetch_blob(self, digest: str, providers: Sequence[str] = (),
                         timeout: float = FETCH_TIMEOUT_S, max_size: int | None = None) -> object:
        return await self._mesh.fetch_blob(digest, providers, timeout=timeout, max_size=max_size)

    async def announce_blob(self, digest: str) -> None:
        await self._mesh.announce_blob(digest)

    def heard_peers(self) -> list[str]:
        return self._mesh.peers.heard()

    async def reach(self, peers: Sequence[str]) -> None:
        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(self._mesh.liveness.ping, peer)

    def health(self, peer: str) -> PeerState | None:
        rec = self._mesh.peers.get(peer)
        return None if rec is None else rec.state

    def _claimants(self) -> list[str]:
        """The peers this node may hold a word of reachability from: those it keeps a record of,
        and those whose presence said it (a large mesh's table holds records of a bounded few)."""
        return [*(rec.peer_id for rec in self._mesh.peers.all()), *self._mesh.said_reach]

    def private_peers(self) -> set[str]:
        return {p for p in [self._mesh.peer_id, *self._claimants()] if self.behind_nat(p)}

    def behind_nat(self, peer: str) -> bool:
        # A peer with neither a record nor presence that says claims nothing: unknown, not behind NAT.
        if peer == self._mesh.peer_id:
            return self._mesh.nat.reachability() in BEHIND_NAT
        return self._mesh.claimed_reachability(peer) in BEHIND_NAT

    def punched_peers(self) -> set[str]:
        out = {p for p in self._claimants() if self._mesh.claimed_reachability(p) == Reachability.RELAYED}
        if self._mesh.nat.reachability() == Reachability.RELAYED:
            out.add(self._mesh.peer_id)
        return out

    def reach_unknown(self, peers: Collection[str]) -> set[str]:
        me = self._mesh.peer_id
        return {p for p in peers if p != me and self._mesh.claimed_reachability(p) == Reachability.UNKNOWN}

    def coordinates(self) -> Mapping[str, Coordinate]:
        return {**self._mesh.coords, self._mesh.peer_id: self._mesh.coord}

    def why_unreachable(self, peer: str) -> str:
        self._mesh.peers.add(peer, displace=False)  # so the mesh looks up its NodeInfo, while there is room
        return str(self._mesh.nat.why_unreachable(peer) or "")

    def peer_ip(self, peer: str) -> str | None:
        return self._mesh.peer_ip(peer)

    def emit(self, kind: EventKind, round_: int | None = None, peer: str | None = None,
             message: str = "", **extra: Any) -> None:
        self._events.emit(kind, job=self._job_id, round=round_, peer=peer, message=message, **extra)

    def penalise(self, peer: str) -> None:
        self._mesh.peers.penalise(peer, PENALTY_POINTS)

    def credit(self, peer: str) -> None:
        self._services.credit(peer)

    def blobs_in_use(self) -> set[str]:
        return self._services.blobs_in_use()

    def announce_soon(self) -> None:
        self._services.announce_soon()

    async def catch_up(self, prefer: Sequence[str] = ()) -> None:
        await self._services.catch_up(prefer)

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        if self._marks is None:
            return await trio.to_thread.run_sync(fn, *args)
        with self._marks.running(self._job_id):
            return await trio.to_thread.run_sync(fn, *args)
