"""Joining the mesh from what the node knows, and patience when no one answers.

At start a node dials its ``--bootstrap`` addresses and the best entries of its address book,
``parallel`` at a time, best first, and is up as soon as any one peer answers; the dials still in
flight go on in the background, as more doors back in. What happens when no one answers depends
on the node's past:

- a brand-new node (it has never met a peer) whose ``--bootstrap`` cannot be reached has most
  likely been given a wrong address: it keeps trying for ``first_run_timeout_s`` and then fails
  with one clear line (:class:`BootstrapError`);
- a node that has been in a mesh before knows the mesh exists and was merely moved, switched off
  or cut off: it never exits, and keeps trying with exponential backoff, saying so in
  :meth:`Joiner.status` and the log, while it also listens for peers that dial it;
- a node with nothing to dial (no bootstrap, an empty book) starts a new mesh.

The same loop watches a running node: if it ever finds itself with no peer at all, it goes back
to dialling what it knows, with the same backoff. Time is trio's clock, so the schedule is tested
under ``trio.testing.MockClock`` with no real waiting; the dialling itself is a function passed in
(``mesh.dialer`` for libp2p).
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from mesh.compat import StrEnum
from mesh.errors import MeshError

log = logging.getLogger("mesh.bootstrap")


class JoinState(StrEnum):
    """How a node stands with the mesh (``status()["join"]["state"]``)."""

    NEW_MESH = "new-mesh"  # nothing to dial: the first node of a mesh, waiting to be dialled
    JOINING = "joining"  # dialling its bootstrap peers and address book
    CONNECTED = "connected"
    WAITING = "waiting"  # has been in a mesh, no one answers: retrying with backoff


class JoinEvent(StrEnum):
    """The events the joiner reports to the embedder's ``on_event``, one per state entered."""

    NEW_MESH = "mesh_new_mesh"
    JOINING = "mesh_joining"
    CONNECTED = "mesh_connected"
    WAITING = "mesh_waiting"


JOIN_EVENTS = {JoinState.NEW_MESH: JoinEvent.NEW_MESH, JoinState.JOINING: JoinEvent.JOINING,
               JoinState.CONNECTED: JoinEvent.CONNECTED, JoinState.WAITING: JoinEvent.WAITING}
Source = Literal["bootstrap", "book"]
Dial = Callable[[str, str], Awaitable[None]]
"""Dial ``(peer_id, addr)``; returns once the handshake proved the peer, raises otherwise."""
DialResult = Callable[[str, str, "str | None"], None]
"""Told ``(peer_id, addr, error)`` after each dial, ``error`` None on success (the address book)."""
MAX_ERROR_LEN = 300


class BootstrapError(MeshError, RuntimeError):
    """A brand-new node could reach none of its bootstrap addresses."""


@dataclass(frozen=True)
class Candidate:
    peer_id: str
    addrs: tuple[str, ...]
    source: Source


@dataclass(frozen=True)
class JoinPolicy:
    first_run_timeout_s: float = 30.0  # a brand-new node gives up on its --bootstrap after this
    dial_timeout_s: float = 10.0  # one address of one peer
    parallel: int = 8
    max_candidates: int = 32  # per round: the best ones
    backoff_min_s: float = 1.0
    backoff_max_s: float = 60.0
    first_run_backoff_max_s: float = 2.0  # a typo should fail on time, a slow peer still be caught
    jitter: float = 0.1
    check_s: float = 1.0  # how often a connected node looks whether it has been left alone

    def __post_init__(self) -> None:
        if self.parallel < 1 or self.max_candidates < 1:
            raise ValueError("parallel and max_candidates must be at least 1")
        if not 0 < self.backoff_min_s <= self.backoff_max_s:
            raise ValueError("backoff must satisfy 0 < backoff_min_s <= backoff_max_s")
        if self.dial_timeout_s <= 0 or self.check_s <= 0 or self.first_run_timeout_s <= 0:
            raise ValueError("timeouts must be positive")


def backoff_delay(attempt: int, low: float, high: float, jitter: float, rng: random.Random) -> float:
    """Seconds before retry number ``attempt`` (1-based): doubling from ``low``, capped at
    ``high``, spread by ±``jitter`` so a mesh restarted at once does not dial in lockstep."""
    base = min(high, low * 2 ** min(max(attempt - 1, 0), 30))
    return max(0.0, base * (1 + rng.uniform(-jitter, jitter)))


@dataclass
class _Round:
    """One pass over the candidates."""

    pending: int
    reached: list[str] = field(default_factory=list)
    settled: trio.Event = field(default_factory=trio.Event)  # one reached, or all failed


class Joiner:
    """Brings a node into the mesh and back into it; see the module docstring."""

    def __init__(self, dial: Dial, candidates: Callable[[], list[Candidate]], connected: Callable[[], bool],
                 policy: JoinPolicy | None = None, *, rng: random.Random | None = None,
                 on_event: Callable[..., None] | None = None, on_dial: DialResult | None = None) -> None:
        self._dial = dial
        self._on_dial = on_dial or (lambda peer, addr, error: None)
        self._candidates = candidates
        self._connected = connected
        self.policy = policy or JoinPolicy()
        self._rng = rng or random.Random()
        self._has_sink = on_event is not None
        self._on_event = on_event or (lambda *a, **k: None)
        self._dialling: set[str] = set()
        self.state: JoinState = JoinState.JOINING
        self.attempt = 0  # failed rounds in a row
        self.rounds = 0
        self.tried = 0  # candidates in the last round
        self.last_error = ""
        self.reached_via = ""  # the peer that let this node in, last time
        self.next_retry_at: float | None = None  # trio clock

    # -- reporting -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """For ``gpuflex status``: where joining stands, and when the next try is."""
        retry = None
        if self.state == JoinState.WAITING and self.next_retry_at is not None:
            retry = round(max(0.0, self.next_retry_at - trio.current_time()), 1)
        return {"state": self.state, "attempt": self.attempt, "tried": self.tried, "next_retry_s": retry,
                "last_error": self.last_error, "reached_via": self.reached_via}

    def _set(self, state: JoinState, message: str = "", warn: bool = False) -> None:
        """Enter ``state``; a message goes to the embedder's event sink, or else to the log."""
        changed = state != self.state
        self.state = state
        if message and (changed or warn):
            if self._has_sink:
                self._on_event(JOIN_EVENTS[state], message=message)
            else:
                log.log(logging.WARNING if warn else logging.INFO, "%s", message)

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, patient: bool, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Join, report ``started`` once the node is up, then keep it joined until cancelled.

        ``patient`` is True for a node that has been in a mesh before. Up means: a peer
        answered; or there is nothing to dial (a new mesh); or, for a patient node, the first
        round failed and the node goes on waiting in the background. A node that is not patient
        raises :class:`BootstrapError` once ``first_run_timeout_s`` has passed."""
        failed: BootstrapError | None = None
        async with trio.open_nursery() as nursery:
            if not self._candidates():
                self._set(JoinState.NEW_MESH, "no peer address known (no --bootstrap, an empty address book): "
                          + ("waiting to be dialled" if patient else "starting a new mesh"))
            elif patient:
                if not await self._round(nursery):
                    self._schedule_retry()
            else:
                failed = await self._first_run(nursery)
            if failed is not None:
                nursery.cancel_scope.cancel()  # raised below, outside the nursery: not in a group
            else:
                task_status.started()
                await self._keep_joined(nursery)
        if failed is not None:
            raise failed

    async def _first_run(self, nursery: trio.Nursery) -> BootstrapError | None:
        policy = self.policy
        with trio.move_on_after(policy.first_run_timeout_s):
            while True:
                if await self._round(nursery):
                    return None
                self.attempt += 1
                await trio.sleep(backoff_delay(self.attempt, min(0.25, policy.backoff_min_s),
                                               policy.first_run_backoff_max_s, 0.0, self._rng))
        return BootstrapError(f"cannot reach any bootstrap peer ({self.last_error or 'timed out'})")

    async def _keep_joined(self, nursery: trio.Nursery) -> None:
        while True:
            if self._connected():
                if self.state != JoinState.CONNECTED:
                    self._set(JoinState.CONNECTED, "connected to the mesh" + (
                        f" (after {self.attempt} failed attempts)" if self.attempt else ""))
                self.attempt, self.next_retry_at = 0, None
                await trio.sleep(self.policy.check_s)
                continue
            if self.state == JoinState.NEW_MESH and not self._candidates():
                await trio.sleep(self.policy.check_s)  # the first node of a mesh: wait to be dialled
                continue
            now = trio.current_time()
            if self.next_retry_at is not None and now < self.next_retry_at:
                await trio.sleep(min(self.policy.check_s, self.next_retry_at - now))
                continue
            if self.state == JoinState.CONNECTED:
                self._set(JoinState.JOINING, "no peer is reachable any more: dialling the known peers", warn=True)
            if not await self._round(nursery):
                self._schedule_retry()

    def _schedule_retry(self) -> None:
        policy = self.policy
        self.attempt += 1
        delay = backoff_delay(self.attempt, policy.backoff_min_s, policy.backoff_max_s, policy.jitter, self._rng)
        self.next_retry_at = trio.current_time() + delay
        message = (f"no known peer answered (attempt {self.attempt}, {self.tried} tried"
                   f"{'; last error: ' + self.last_error if self.last_error else ''}); "
                   f"retrying in {delay:.0f}s: this node has been in a mesh, so it keeps trying")
        self._set(JoinState.WAITING, message, warn=True)

    # -- one round -------------------------------------------------------------------------------

    async def _round(self, nursery: trio.Nursery) -> bool:
        """Dial the best candidates, ``parallel`` at a time; True as soon as one answers.

        The dials still in flight then finish in ``nursery``: each one that succeeds is one
        more connection, made without waiting for a DHT walk."""
        cands = [c for c in self._candidates() if c.peer_id not in self._dialling][: self.policy.max_candidates]
        self.rounds += 1
        began = trio.current_time()
        self.tried = len(cands)
        if self.state not in (JoinState.CONNECTED, JoinState.WAITING):  # a waiting node says so until it is back
            self._set(JoinState.JOINING)
        if not cands:
            self.last_error = self.last_error or "no peer address to dial"
            return self._connected()
        rnd = _Round(pending=len(cands))
        queue = deque(cands)
        for cand in cands:
            self._dialling.add(cand.peer_id)
        for _ in range(min(self.policy.parallel, len(cands))):
            nursery.start_soon(self._worker, queue, rnd)
        await rnd.settled.wait()
        if rnd.reached:
            self.reached_via = rnd.reached[0]
            self.last_error = ""
            self.attempt, self.next_retry_at = 0, None
            self._set(JoinState.CONNECTED, f"joined the mesh through {self.reached_via[-8:]} "
                      f"({len(cands)} known peers dialled, {trio.current_time() - began:.1f}s)")
            return True
        return self._connected()  # someone may have dialled in meanwhile

    async def _worker(self, queue: deque[Candidate], rnd: _Round) -> None:
        """Takes the best candidate left, so dials start strictly in rank order."""
        while queue:
            cand = queue.popleft()
            try:
                if await self._try(cand):
                    rnd.reached.append(cand.peer_id)
                    rnd.settled.set()
            finally:
                self._dialling.discard(cand.peer_id)
                rnd.pending -= 1
                if rnd.pending == 0:
                    rnd.settled.set()

    async def _try(self, cand: Candidate) -> bool:
        for addr in cand.addrs:
            try:
                with trio.fail_after(self.policy.dial_timeout_s):
                    await self._dial(cand.peer_id, addr)
            except trio.TooSlowError:
                self._note_error(cand, addr, f"no answer within {self.policy.dial_timeout_s:.0f}s")
                continue
            except Exception as exc:
                self._note_error(cand, addr, f"{exc.__class__.__name__}: {exc}")
                continue
            self._on_dial(cand.peer_id, addr, None)
            return True
        return False

    def _note_error(self, cand: Candidate, addr: str, error: str) -> None:
        text = f"{addr}/p2p/{cand.peer_id}: {error}"
        self.last_error = text if len(text) <= MAX_ERROR_LEN else text[: MAX_ERROR_LEN - 1] + "…"
        log.debug("dial of %s (%s) failed: %s", cand.peer_id[-8:], cand.source, self.last_error)
        self._on_dial(cand.peer_id, addr, error)


class PeerBackoff:
    """When a peer that has no connection may be dialled again: after each failed redial the
    wait doubles from ``low`` up to ``high``; a success forgets the peer. It replaces
    py-libp2p's fixed 60 s negative cache for the peers a node already knows, so a peer that
    comes back (often on a new port) is redialled within ``high``, never later."""

    def __init__(self, low: float = 2.0, high: float = 30.0, max_peers: int = 4096,
                 rng: random.Random | None = None) -> None:
        self.low, self.high, self.max_peers = low, high, max_peers
        self._rng = rng or random.Random()
        self._next: dict[str, tuple[float, int]] = {}  # peer -> (not before, failures)

    def ready(self, peer: str) -> bool:
        entry = self._next.get(peer)
        return entry is None or trio.current_time() >= entry[0]

    def failed(self, peer: str) -> float:
        """Count a failed redial; returns the seconds until the next one is allowed."""
        failures = self._next.get(peer, (0.0, 0))[1] + 1
        delay = backoff_delay(failures, self.low, self.high, 0.1, self._rng)
        if peer not in self._next and len(self._next) >= self.max_peers:
            self._next.pop(next(iter(self._next)))  # the oldest entry: bounded memory
        self._next[peer] = (trio.current_time() + delay, failures)
        return delay

    def ok(self, peer: str) -> None:
        self._next.pop(peer, None)
