"""What strangers' keys may cost a node: the peer table's cap, whom it evicts, and where the
penalties of keys that are not peers are kept.

A key costs nothing to make, so anything keyed by a peer id must be bounded. A peer-table
entry is dear: every entry is probed every sweep, its NodeInfo is looked up in the DHT, it is
redialled, listed by the control API and the portal. So only a peer this node has some
reason to talk to gets one: one that connected or answered (``PeerTable.seen``), or one it
was told of with addresses (the DHT, peer exchange, a job member it looks for). A key seen
only as the signer of a message, or as the target of a penalty, gets a *mark* instead
(:class:`Marks`): its penalty and whether it is ignored, kept in a bounded LRU map, and no
probes, lookups or rows. A mark becomes an entry, penalty and all, when the peer connects.

The table holds at most ``max_peers`` entries (``DEFAULT_MAX_PEERS``), of which at most a
half (``hint_quota``) are hints: a new hint past that quota replaces the oldest hint, so
hints passed on by others never crowd out peers this node has heard from. Likewise at most a
quarter (``stranger_quota``) are strangers: keys that connected to this node but that it never
reached itself (``PeerTable.reached``: it dialled them, they answered its ping or its request).
A connection costs a key nothing, so a new stranger past that quota replaces the stranger worth
least, and never a peer this node reached. When a new one comes, the entry worth least goes
(``keep_rank``): one never heard from (a hint) before one that was, a stranger before a peer
this node reached, a down one before a suspect one before an up one, then the one silent
longest. Neither a hint nor a stranger displaces a reached peer that is up: while the table is
full of those, the newcomer is dropped. Listeners (``PeerTable.on_evict``) drop what other
layers keep per peer.

Pure bookkeeping: no I/O, no trio.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

#: Peers a node keeps in its table (connected, answered, or named with addresses).
DEFAULT_MAX_PEERS = 4096
#: Keys that are not peers but carry a penalty (a forged signature, say), remembered at once.
MAX_MARKS = 4096
#: At most one entry in this many is a hint (never heard from); the oldest hint makes room.
HINT_SHARE = 2
#: At most one entry in this many is a stranger (connected, never reached); the worst makes room.
STRANGER_SHARE = 4
_STATE_RANK = {"down": 0, "suspect": 1, "up": 2}


class Ranked(Protocol):
    """What ``keep_rank`` reads of a peer-table entry (``mesh.health.PeerRecord``)."""

    peer_id: str
    first_seen: float
    last_seen: float | None
    rounds_contributed: int
    reached: bool

    @property
    def state(self) -> str: ...


def heard_from(rec: Ranked) -> bool:
    """Whether the peer itself ever answered or sent something (not merely named)."""
    return rec.last_seen is not None


def stranger(rec: Ranked) -> bool:
    """Heard from (it connected), but never reached by this node itself, nor a contributor."""
    return heard_from(rec) and not rec.reached and rec.rounds_contributed == 0


def keep_rank(rec: Ranked) -> tuple[bool, bool, int, bool, float]:
    """Sort key: the entry with the smallest is evicted first."""
    return (heard_from(rec), not stranger(rec), _STATE_RANK.get(str(rec.state), 0), rec.rounds_contributed > 0,
            rec.last_seen if rec.last_seen is not None else rec.first_seen)


R = TypeVar("R", bound=Ranked)


def hint_quota(max_peers: int) -> int:
    """Entries never heard from (hints) a table of ``max_peers`` holds at once: each is probed
    and looked up, and any stranger can pass on thousands."""
    return max(8, max_peers // HINT_SHARE)


def stranger_quota(max_peers: int) -> int:
    """Strangers (connected, never reached) a table of ``max_peers`` holds at once."""
    return max(8, max_peers // STRANGER_SHARE)


def victim(records: Iterable[R], *, newcomer_heard: bool, newcomer_reached: bool = True) -> R | None:
    """The entry to evict for a newcomer, or None when the newcomer is worth less than every
    entry: a full table of live peers is not displaced by hints, nor one of live peers this
    node reached by strangers."""
    worst = min(records, key=keep_rank, default=None)
    if worst is None:
        return None
    if str(worst.state) == "up" and ((not newcomer_heard and heard_from(worst))
                                     or (not newcomer_reached and heard_from(worst) and not stranger(worst))):
        return None
    return worst


class Marks(Generic[R]):
    """Records of keys that are not peers, held only for their penalty; the least recently
    touched goes first past ``limit``."""

    def __init__(self, limit: int = MAX_MARKS) -> None:
        self.limit = limit
        self._marks: OrderedDict[str, R] = OrderedDict()

    def __len__(self) -> int:
        return len(self._marks)

    def get(self, peer_id: str) -> R | None:
        return self._marks.get(peer_id)

    def put(self, rec: R) -> R:
        self._marks[rec.peer_id] = rec
        self._marks.move_to_end(rec.peer_id)
        while len(self._marks) > self.limit:
            self._marks.popitem(last=False)
        return rec

    def pop(self, peer_id: str) -> R | None:
        return self._marks.pop(peer_id, None)
