"""The narrow interface between one job and the node that runs it.

A job's objects (the driver and its roles) receive a ``JobPort`` and nothing else of the node:
never the job manager, the runtime or the mesh node themselves. Everything a round needs from
outside is named here (the mesh verbs, the blob store, peer health, the identity, the event
sink, the penalty and credit callbacks, the home directory, and where blocking work runs), so
a test can stand in for the whole node with one small fake, and a reader sees at a glance
what a job can do to its node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from gpuflex.node.clock import DeadlineClock
from gpuflex.node.core.kinds import EventKind
from mesh.health import PeerState
from mesh.identity import Identity
from mesh.vivaldi import Coordinate

T = TypeVar("T")

#: A direct message's default timeout, as the mesh's own ``request``.
REQUEST_TIMEOUT_S = 30.0
#: A blob download's default timeout, as the mesh's own ``fetch_blob``.
FETCH_TIMEOUT_S = 120.0


class BlobStorePort(Protocol):
    """Content-addressed local storage (``mesh.blob.BlobStore``)."""

    def put(self, data: bytes | memoryview) -> str: ...

    def put_parts(self, parts: Sequence[bytes | memoryview]) -> str: ...

    def read(self, digest: str, verify: bool = True) -> bytes: ...

    def has(self, digest: str) -> bool: ...

    def size(self, digest: str) -> int: ...

    def discard(self, digest: str) -> bool: ...


class JobPort(Protocol):
    """Everything one job may use of its node."""

    @property
    def identity(self) -> Identity:
        """This node's signing key; ``identity.peer_id`` is who "me" is."""
        ...

    @property
    def home(self) -> Path:
        """The node's home directory (data locations are resolved against it)."""
        ...

    @property
    def blobs(self) -> BlobStorePort: ...

    @property
    def clock(self) -> DeadlineClock: ...

    # -- the mesh verbs ------------------------------------------------------------------------

    async def request(self, peer: str, frame: bytes, payload: bytes | None = None,
                      timeout: float = REQUEST_TIMEOUT_S) -> Any:
        """Deliver a signed frame (and payload) to ``peer``; its handler's reply, or SendError."""
        ...

    async def broadcast(self, frame: bytes) -> int:
        """Gossip a signed frame to the mesh; it is applied here first."""
        ...

    async def fetch_blob(self, digest: str, providers: Sequence[str] = (),
                         timeout: float = FETCH_TIMEOUT_S, max_size: int | None = None) -> object:
        """Hold blob ``digest`` locally, downloading it if needed; BlobError if nobody serves it
        (or only at an announced size over ``max_size``)."""
        ...

    async def announce_blob(self, digest: str) -> None:
        """Tell the mesh this node serves ``digest`` (best effort)."""
        ...

    # -- peer health -----------------------------------------------------------------------------

    def heard_peers(self) -> list[str]:
        """Peers that are up, not ignored for misbehaviour, and that this node heard from itself
        (``mesh.health.PeerTable.heard``): only these are planned or counted toward
        ``min_nodes``. A key known by hearsay alone (its signed NodeInfo relayed by another
        peer) may have no process behind it, and would hold a plan's round until its deadline."""
        ...

    async def reach(self, peers: Sequence[str]) -> None:
        """Ping ``peers`` at once (the caller bounds them and the time): those that answer are
        heard from (``heard_peers``) from now on."""
        ...

    def health(self, peer: str) -> PeerState | None:
        """``peer``'s health (down once silent past the threshold), None if never heard of."""
        ...

    def private_peers(self) -> set[str]:
        """Peers (and this node) that say they cannot accept connections (behind NAT): they
        never lead a group or root a round while others can."""
        ...

    def behind_nat(self, peer: str) -> bool:
        """Whether ``peer`` is one of ``private_peers``: whose-turn checks ask it of one peer
        at every presence, where building the whole set walked the peer table each time."""
        ...

    def punched_peers(self) -> set[str]:
        """Of ``private_peers``, those that say they are reached through a relay and a hole
        punch (``relayed``): they lead groups before any group grows past ``group_size``."""
        ...

    def reach_unknown(self, peers: Collection[str]) -> set[str]:
        """Of ``peers`` (this node aside), those whose reachability this node holds no claim
        of (no presence or NodeInfo says): in a mesh with homes in it, such a member leads
        only after the reachable and the hole-punched ones, as it may be a home nobody can dial."""
        ...

    def coordinates(self) -> Mapping[str, Coordinate]:
        """Network coordinates (``mesh.vivaldi``) of this node and the peers it knows them of:
        a round's groups are cut by nearness, so a leader is near its members."""
        ...

    def why_unreachable(self, peer: str) -> str:
        """What this node can tell of why ``peer`` is out of reach ("" if nothing)."""
        ...

    def peer_ip(self, peer: str) -> str | None:
        """The IP address ``peer`` is connected from (its side of a live connection), None if
        unknown: what the per-network cap of open jobs counts (``mesh.netprefix``)."""
        ...

    # -- what the job tells its node -------------------------------------------------------------

    def emit(self, kind: EventKind, round_: int | None = None, peer: str | None = None,
             message: str = "", **extra: Any) -> None:
        """Report an event of this job (the control API's event stream, the log)."""
        ...

    def penalise(self, peer: str) -> None:
        """Score one fault against ``peer`` (bad input it is to blame for)."""
        ...

    def credit(self, peer: str) -> None:
        """Count one committed contribution of ``peer``."""
        ...

    def blobs_in_use(self) -> set[str]:
        """Blobs any job on this node still needs; pruning never deletes them."""
        ...

    def announce_soon(self) -> None:
        """Send this node's presence soon, not at its next period: what it publishes changed
        (it is ready for the job and has measured its throughput, which plans need)."""
        ...

    async def catch_up(self, prefer: Sequence[str] = ()) -> None:
        """Ask peers (``prefer`` first) for newer ledgers; what they hold comes back through
        the job's own ``offer_ledger``."""
        ...

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work (training, evaluation, masking) off the event loop."""
        ...


class Trainer(Protocol):
    """A node's share of one job's model and data (``gpuflex.ml.workload.Workload``)."""

    @property
    def num_samples(self) -> int: ...

    def initial_params(self) -> np.ndarray: ...

    def train(self, base: np.ndarray, max_steps: int = 0, time_limit_s: float = 0.0,
              server_state: Mapping[str, np.ndarray] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Train from ``base``. In a time-budgeted round, at most ``max_steps`` steps (0: no
        count) and stop once ``time_limit_s`` seconds of training have passed; with neither,
        the job's epochs or steps. Metrics include ``steps``, ``seconds`` and ``samples_per_s``.
        ``server_state`` is the state that came with ``base`` (SCAFFOLD reads its control
        variate there); with SCAFFOLD the vector returned is the model's delta, then the
        control variate's."""
        ...

    def fitted(self) -> dict[str, Any]:
        """How the job fits this device: ``device`` (a short description), ``samples_per_s``
        (measured with real steps) and the chosen settings (precision, micro-batch, threads)."""
        ...

    def evaluate(self, params: np.ndarray) -> dict[str, float]: ...

    def export_model(self, params: np.ndarray, out: Path) -> list[Path]: ...


#: Builds a job's Trainer: (spec, part index, number of parts, home, data hook).
TrainerFactory = Callable[[Any, int, int, Path, Callable[..., Any] | None], Trainer]
#: Loads a model blob by hash from these providers: (parameters, optimizer state).
ModelLoader = Callable[[str, list[str]], Awaitable[tuple[np.ndarray, dict[str, np.ndarray]]]]
