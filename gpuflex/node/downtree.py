"""The committed model's way down the group tree.

A round's result names the new model (and, with a step codec, the encoded step members
replay) by hash. If every member fetched it from the root, the root's uplink would carry one
copy per member, a load that grows with the mesh. Instead each member asks its parent in the
round's tree first, then the ancestors above it, the root (the round's coordinator) last: a
leader that holds the committed model serves its own children, so a node sends a copy per
child, not per member. The exception is a leader behind NAT (``down_chain``): its children
fetch from the nearest public ancestor, whose uplink is ten times a home one or more. Whoever serves it, the bytes are checked against the hash the signed
result names (``mesh.blob`` refuses a blob whose hash differs, and a replayed step is checked
against the model hash), so a parent can delay the model but not change it.

A parent fetches the model from its own parent when the result reaches it, so a child may ask
before the parent holds it: a "not found" from an ancestor that is up is asked again, with a
short backoff, until a bounded wait for the whole chain has passed; any other failure (the
ancestor unreachable, down, slow or serving wrong bytes) moves on to the next one up at once.
"""

from __future__ import annotations

import logging

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


def down_chain(res: Result, me: str) -> list[str]:
    """Whom ``me`` fetches ``res``'s model (or step) from: its ancestors in the round's tree
    (the signed plan the result commits), nearest first and the coordinator last, those the
    plan lists as behind NAT after the others. A home leader hole-punched into leading sends
    on a home uplink, a tenth of a public one or less: seven copies from it take longer than
    seventy from a public node, so its children fetch from the nearest public ancestor and
    ask it only if that fails. With no public ancestor the order is the tree's. A node
    outside the plan asks the coordinator."""
    plan = res.plan
    chain = ancestors(plan.parent, me) if me in plan.parent else []
    if res.coordinator not in chain:
        chain.append(res.coordinator)
    private = set(plan.private)
    return sorted((p for p in chain if p != me), key=lambda p: p in private)  # stable: nearest first


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
