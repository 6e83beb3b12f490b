"""Discovery: who is in the mesh, where they are, and what they say of themselves.

Three loops beside a ``MeshNode``, all on trio's clock:

* the DHT walk, often while the node is new and still finding peers (1 s apart, doubling),
  rarely after; the routing table and the open connections are read every
  ``refresh_fast_s`` all along, which costs no traffic, so a peer that dials in is known
  within a second;
* the NodeInfo publish, a few times while the node is new, then every ``PUBLISH_MAX_S`` and
  when it changes (a put reaches up to k = 20 peers: a cost that grows with the mesh up to
  that size);
* NodeInfo lookups, bounded per period, of the peers this node keeps (``keep_set``) alone:
  each one's once when it is learnt or comes back, then the watched peers' (``watch_set``)
  now and then, so the cost does not grow with the mesh; a kept peer that is not up is
  looked up every ``info_retry_s``, less often after each lookup that found nothing (its
  NodeInfo in the DHT may name relays to reach it by). Other members' NodeInfo comes signed
  with them, by peer exchange (``mesh.pex``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import trio

from mesh.health import UP, PeerRecord, PeerTable
from mesh.names import peer_text
from mesh.reachability import Reachability
from mesh.reachability import parse as parse_reachability
from mesh.records import nodeinfo_key

log = logging.getLogger("mesh.discovery")
#: One DHT chore (a routing-table walk, a NodeInfo publish): bounded so a stuck one cannot
#: stall the loop that runs it.
DHT_CHORE_S = 10.0
#: NodeInfo is published this long after start, then every ``PUBLISH_MAX_S``, and
#: ``REPUBLISH_AFTER_CHANGE_S`` after it changes.
PUBLISH_AFTER_S, PUBLISH_MAX_S, REPUBLISH_AFTER_CHANGE_S = (1.0, 4.0, 15.0, 60.0), 300.0, 2.0
#: The DHT walk slows down after this many fast walks in a row that found no new peer.
QUIET_WALKS = 3
#: NodeInfo lookups started per period, whatever the size of the mesh.
INFO_LOOKUPS_PER_PERIOD = 4
#: Watched peers' NodeInfo is refreshed every 5 s while they still check their reachability,
#: every 30 s while they are private (a relay reservation, and with it an address others can
#: reach, may come at any time), and every 2 min once public or relayed: their record is
#: resealed at most once a minute (``INFO_RESEAL_S``), their coordinate also comes with their
#: presence, and at 30 s these lookups were the largest part of a settled node's upkeep, growing
#: with its neighbours up to the overlay's degree. Other up peers' only when it is missing.
INFO_SETTLED_S, INFO_REFRESH_S, INFO_CHECKING_S = 120.0, 30.0, 5.0
#: A peer that is not up and whose NodeInfo could not be had is looked up less and less often,
#: doubling from ``info_retry_s`` to this: each try may be a DHT walk, and a mesh that has
#: seen churn holds many peers that are gone for good.
INFO_RETRY_MAX_S = 300.0
#: ``learn_routing_table`` passes over every entry at least this often, whatever the sizes say.
LEARN_FULL_S = 30.0


async def best_effort(what: str, chore: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    """Run one py-libp2p DHT chore within ``timeout``; None if it failed or timed out.

    The only place the mesh swallows any exception from a DHT call: py-libp2p raises from
    several unrelated roots (its BaseLibp2pError, trio's, OSError, multiaddr's, its resource
    manager's own), and a background chore that fails must never take the node down; the
    next round of the loop tries again.
    """
    with trio.move_on_after(timeout):
        try:
            return await chore()
        except Exception as exc:  # see the docstring: the one catch-all for DHT chores
            log.debug("%s failed: %s", what, exc)
    return None


class DiscoverySettings(Protocol):
    refresh_fast_s: float
    refresh_slow_s: float
    fast_refresh_period_s: float
    info_retry_s: float


class DiscoveryHost(Protocol):
    """What discovery uses of its node (``mesh.node.MeshNode``)."""

    peer_id: str
    peers: PeerTable
    host: Any
    dht: Any

    @property
    def config(self) -> DiscoverySettings: ...

    def watch_set(self) -> set[str]: ...

    def keep_set(self) -> set[str]: ...

    def sealed_info(self) -> bytes: ...

    async def fetch_node_info(self, peer: str, timeout: float = 5.0) -> dict[str, Any] | None: ...


class Discovery:
    def __init__(self, node: DiscoveryHost) -> None:
        self.node = node
        self._info_tried: dict[str, float] = {}
        self._info_loading: set[str] = set()
        self._info_misses: dict[str, int] = {}  # peer -> lookups in a row that found nothing
        self._changed = trio.Event()  # this node's NodeInfo changed since it was last published
        self._learnt: tuple[int, int, int] = (-1, -1, -1)  # sizes at the last learn_routing_table
        self._learnt_at = -math.inf

    async def walk_loop(self) -> None:
        cfg = self.node.config
        started = trio.current_time()
        next_walk = started
        gap = cfg.refresh_fast_s
        quiet = 0  # walks in a row that found no peer this node did not know
        while True:
            if trio.current_time() >= next_walk:
                before = len(self.node.peers.all())
                await best_effort("routing table refresh", self.node.dht.refresh_routing_table, DHT_CHORE_S)
                self.learn_routing_table(force=True)
                quiet = quiet + 1 if len(self.node.peers.all()) <= before else 0
                # Often while new and still finding peers, each gap twice the last (a walk
                # reaches up to k = 20 peers, and a whole mesh starting at once walks together);
                # once walks stop finding any, newcomers reach this node by their own walks,
                # read from the routing table below.
                fast = trio.current_time() - started < cfg.fast_refresh_period_s and quiet < QUIET_WALKS
                next_walk = trio.current_time() + (gap if fast else cfg.refresh_slow_s)
                gap = min(gap * 2, cfg.refresh_slow_s)
            self.learn_routing_table()
            await trio.sleep(max(0.0, min(cfg.refresh_fast_s, next_walk - trio.current_time())))

    async def publish_loop(self) -> None:
        """Publish this node's NodeInfo ``PUBLISH_AFTER_S`` after start (its routing table
        grows meanwhile, so each put reaches more peers), then every ``PUBLISH_MAX_S`` and soon
        after it changes (``republish_soon``): a put reaches up to k = 20 peers, so a node that
        republished often cost every peer of a mesh of up to 20 more the larger it was."""
        started = trio.current_time()
        schedule = list(PUBLISH_AFTER_S)
        while True:
            await best_effort("publishing NodeInfo", partial(
                self.node.dht.put_value, nodeinfo_key(self.node.peer_id), self.node.sealed_info()), DHT_CHORE_S)
            self._changed = trio.Event()
            until = started + schedule.pop(0) if schedule else trio.current_time() + PUBLISH_MAX_S
            with trio.move_on_at(until):
                await self._changed.wait()
                await trio.sleep(REPUBLISH_AFTER_CHANGE_S)  # a change seldom comes alone

    def republish_soon(self) -> None:
        """This node's NodeInfo changed (its reachability, its relays): publish it again soon."""
        self._changed.set()

    def learn_routing_table(self, force: bool = False) -> None:
        """Put the DHT routing table's peers and the connected ones into the peer table. It
        runs every second; while neither the routing table, the connections nor the peer table
        changed in size it is skipped (a full pass after each DHT walk and at least every
        ``LEARN_FULL_S``): at 1,000 nodes the pass was 200 lookups a node a second, most of
        them of peers known already."""
        table = self.node.dht.routing_table.get_peer_ids()
        connected = self.node.host.get_connected_peers()
        key, now = (len(table), len(connected), self.node.peers.version), trio.current_time()
        if not force and key == self._learnt and now < self._learnt_at + LEARN_FULL_S:
            return
        for pid in table:
            self.learn(pid)
        for pid in connected:
            self.learn(pid)
        # The version again: what was just learnt moved it, and must not look like a change.
        self._learnt, self._learnt_at = (len(table), len(connected), self.node.peers.version), now

    def learn(self, pid: Any) -> None:
        from libp2p.peer.peerstore import PeerStoreError

        text = peer_text(pid)
        if text == self.node.peer_id:
            return
        rec = self.node.peers.get(text)
        if rec is not None and rec.addrs:
            return  # known, with addresses: this runs every second over every connection
        try:
            addrs = [str(a) for a in self.node.host.get_peerstore().addrs(pid)]
        except PeerStoreError:  # known from a connection, with no address stored yet
            addrs = []
        self.node.peers.add(text, addrs)

    # -- NodeInfo lookups ----------------------------------------------------------------------

    def forget_info(self, peer: str, keep: int) -> None:
        """An evicted peer: when it was looked up stays (so it is not looked up again the
        moment it returns), but the record of lookups is held to ``keep`` entries."""
        self._info_loading.discard(peer)
        while len(self._info_tried) > keep:
            del self._info_tried[next(iter(self._info_tried))]
        while len(self._info_misses) > keep:
            del self._info_misses[next(iter(self._info_misses))]

    def info_due(self, rec: PeerRecord, now: float, watched: set[str]) -> bool:
        """Missing: at once, the first time. Up and watched: every 5 s while it still checks its
        reachability, every half minute while private, then every 2 min. Up and not watched:
        never again. Not up, or missing after a lookup that found nothing: every
        ``info_retry_s``, doubling after each lookup that found nothing (to
        ``INFO_RETRY_MAX_S``)."""
        age = now - self._info_tried.get(rec.peer_id, -1e9)
        misses = self._info_misses.get(rec.peer_id, 0)
        retry = min(INFO_RETRY_MAX_S, self.node.config.info_retry_s * 2 ** min(misses, 16))
        if rec.state != UP:
            return age > retry
        if rec.info is None:
            return misses == 0 or age > retry
        if rec.peer_id not in watched:
            return False
        reach = parse_reachability(rec.info.get("reachability"))
        return age > (INFO_CHECKING_S if reach == Reachability.UNKNOWN
                      else INFO_REFRESH_S if reach == Reachability.PRIVATE else INFO_SETTLED_S)

    def look_up_infos(self, nursery: trio.Nursery) -> None:
        """Start this period's NodeInfo lookups (at most ``INFO_LOOKUPS_PER_PERIOD``), among the
        peers this node keeps (``keep_set``) alone: any other member's NodeInfo came with it
        (peer exchange), and looking up every member once would cost a mesh of N N² lookups."""
        now = trio.current_time()
        watched = self.node.watch_set()
        records = [r for p in self.node.keep_set() if (r := self.node.peers.get(p)) is not None]
        due = [r for r in records
               if r.peer_id not in self._info_loading and self.info_due(r, now, watched)]
        due.sort(key=lambda r: (r.info is not None, self._info_tried.get(r.peer_id, -1e9)))
        for rec in due[:INFO_LOOKUPS_PER_PERIOD]:
            self._info_tried[rec.peer_id] = now
            self._info_loading.add(rec.peer_id)
            nursery.start_soon(self._load_info, rec.peer_id)

    async def _load_info(self, peer: str) -> None:
        try:
            info = await self.node.fetch_node_info(peer)
            rec = self.node.peers.get(peer)
            if info is not None and rec is not None:
                rec.info = info
            if info is None:
                self._info_misses[peer] = self._info_misses.pop(peer, 0) + 1
            else:
                self._info_misses.pop(peer, None)
        finally:
            self._info_loading.discard(peer)

    async def info_loop(self, period: float) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                self.look_up_infos(nursery)
                await trio.sleep(period)
