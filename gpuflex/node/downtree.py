"""The committed model's way down the group tree.

A round's result names the new model (and, with a step codec, the encoded step members
replay) by hash. If every member fetched it from the root, the root's uplink would carry one
copy per member, a load that grows with the mesh. Instead each member asks its parent in the
round's tree first, then the ancestors above it, the root (the round's coordinator) last: a
leader that holds the committed model serves its own children, so a node sends a copy per
child, not per member. The exception is a leader behind NAT (``first_sources``): its
children fetch from public nodes nearer the root, spread so that each takes few extra
copies, since a public uplink is ten times a home one or more. Whoever serves it, the bytes
are checked against the hash the signed result names (``mesh.blob`` refuses a blob whose
hash differs, and a replayed step is checked against the model hash), so a parent can delay
the model but not change it.

A parent fetches the model from its own parent when the result reaches it, so a child may ask
before the parent holds it: a "not found" from an ancestor that is up is asked again, with a
short backoff, until a bounded wait for the whole chain has passed; any other failure (the
ancestor unreachable, down, slow or serving wrong bytes) moves on to the next one up at once.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Collection, Mapping

import trio

from gpuflex.node.collector import ancestors
from gpuflex.node.core.messages import Result
from gpuflex.node.port import JobPort
from mesh.blob import BlobError, BlobNotFound
from mesh.health import PeerState

log = logging.getLogger("gpuflex.downtree")
#: How long, in all, a member keeps asking ancestors that do not hold the committed blob yet
#: (they are fetching it from above) before it only asks each of the rest once; the root
#: holds it from the commit on.
WAIT_S = 60.0
#: The first pause before asking such an ancestor again; it doubles up to ``POLL_MAX_S``.
POLL_FIRST_S = 0.1
POLL_MAX_S = 0.5


def first_sources(parent: Mapping[str, str | None], private: Collection[str]) -> dict[str, str]:
    """Member -> the node it asks first for a round's model: its parent, unless the parent is
    behind NAT (a home leader's uplink is a tenth of a public one or less, so seven copies
    from it take longer than seventy from a public node). A member under such a parent asks
    the public node with the fewest copies to send so far among those nearer the root than
    it (so they hold the model no later than its parent would), ties to the nearer and the
    earlier in the plan: the extra copies are spread over the public nodes instead of all
    falling on the nearest public ancestor. With no public node to ask, the parent.

    Every member computes the same map from the signed plan alone (``parent`` keeps the
    plan's order), in O(n log n)."""
    order = {m: i for i, m in enumerate(parent)}
    kids: dict[str, list[str]] = {}
    root = None
    for m, p in parent.items():
        if p is None:
            root = m
        else:
            kids.setdefault(p, []).append(m)
    if root is None:
        return {}
    level, depth = [root], {root: 0}
    by_depth: list[list[str]] = []
    while level and len(depth) <= len(parent):  # breadth first; a plan's tree is checked acyclic
        by_depth.append(level)
        level = [k for m in level for k in kids.get(m, []) if k not in depth]
        depth.update((k, len(by_depth)) for k in level)
    load = dict.fromkeys((m for m in parent if m not in private), 0)
    source: dict[str, str] = {}
    under_home: list[str] = []
    for m, p in parent.items():
        if p is None or m not in depth:
            continue
        if p in private:
            under_home.append(m)
        else:
            source[m] = p
            load[p] += 1
    heap: list[tuple[int, int, int, str]] = []
    added = 0
    for m in sorted(under_home, key=lambda m: (depth[m], order[m])):
        while added < depth[m]:  # public nodes nearer the root than m become candidates
            heap += [(load[q], added, order[q], q) for q in by_depth[added] if q in load]
            heapq.heapify(heap)
            added += 1
        if not heap:
            source[m] = parent[m] or root
            continue
        _, d, i, q = heapq.heappop(heap)
        source[m] = q
        load[q] += 1
        heapq.heappush(heap, (load[q], d, i, q))
    return source


def down_chain(res: Result, me: str) -> list[str]:
    """Whom ``me`` fetches ``res``'s model (or step) from: its first source
    (``first_sources``), then its ancestors in the round's tree (the signed plan the result
    commits), nearest first, those behind NAT after the others, the coordinator last. A node
    outside the plan asks the coordinator."""
    plan = res.plan
    chain = ancestors(plan.parent, me) if me in plan.parent else []
    if res.coordinator not in chain:
        chain.append(res.coordinator)
    private = set(plan.private)
    chain = sorted(chain, key=lambda p: p in private)  # stable: nearest first
    first = first_sources(plan.parent, private).get(me) if me in plan.parent else None
    if first is not None:
        chain = [first, *(p for p in chain if p != first)]
    return [p for p in chain if p != me]


async def fetch_down(port: JobPort, digest: str, chain: list[str], *, timeout: float, max_size: int,
                     wait_s: float = WAIT_S) -> str:
    """Hold blob ``digest``, fetched from the first of ``chain`` that serves it; returns who
    served it ("" when it was here already). BlobError when none of them did."""
    if port.blobs.has(digest):
        return ""
    errors: list[str] = []
    stop_waiting = trio.current_time() + wait_s
    for index, peer in enumerate(chain):
        pause = POLL_FIRST_S
        for _ in range(int(wait_s / POLL_FIRST_S) + 1):  # bounded; the deadline ends it sooner
            try:
                await port.fetch_blob(digest, [peer], timeout=timeout, max_size=max_size)
                return peer
            except BlobNotFound as exc:
                last = index == len(chain) - 1
                if last or trio.current_time() + pause > stop_waiting or port.health(peer) == PeerState.DOWN:
                    errors.append(str(exc))
                    break
                await trio.sleep(pause)
                pause = min(POLL_MAX_S, pause * 2)
            except BlobError as exc:
                errors.append(str(exc))
                break
        if index < len(chain) - 1:
            log.info("blob %s: %s did not serve it (%s); asking %s", digest[:12], peer[-8:],
                     errors[-1] if errors else "waited too long", chain[index + 1][-8:])
    raise BlobError(f"no tree ancestor served blob {digest[:16]}…: {'; '.join(errors[-4:]) or 'nobody to ask'}")
