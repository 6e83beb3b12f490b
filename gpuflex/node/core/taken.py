"""The ``taken`` notice: work that went past a tree node, folded higher up; and the ``empty``
notice: a leader that ended up with nothing to send.

A member whose send to its leader fails sends to the next ancestor (``gpuflex.node.uplink``);
the node that folds it tells each node the work went past, so they stop waiting for it. A
leader whose members all went past it, and whose own update is not in, has no partial to
send; it tells its parent so, and the parent stops waiting for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuflex.node.core.fields import read_count, read_field, read_strs
from gpuflex.node.core.messages import MAX_ATTEMPT, MAX_ROUND
from mesh.codec import Envelope, WireError, WireReason


@dataclass(frozen=True)
class Taken:
    """A tree node's word to a node below it in the plan's tree: it folded these peers' work
    itself, because it went past the node (a member's send to its leader failed, so the member
    sent to the next ancestor). The node stops waiting for them and refuses them from then on;
    without the word it waited for them until its reduce deadline (120 s in a first round)."""

    job: str
    round: int
    attempt: int
    plan: str  # the digest of the plan the work was done for
    by: str  # the ancestor that folded it (the signer)
    peers: tuple[str, ...]
    env: Envelope


def _attempt_of(b: object, what: str) -> tuple[str, int, int, str]:
    """The fields both notices carry first: the job, round, attempt and plan they are about."""
    return (read_field(b, "job", str, what), read_count(b, "round", what, 1, MAX_ROUND),
            read_count(b, "attempt", what, 0, MAX_ATTEMPT), read_field(b, "plan", str, what))


def parse_taken(env: Envelope) -> Taken:
    b, what = env.body, "taken notice"
    taken = Taken(*_attempt_of(b, what), by=read_field(b, "by", str, what), peers=read_strs(b, "peers", what),
                  env=env)
    if taken.by != env.sender or not taken.peers:
        raise WireError(WireReason.GARBLED, "taken notice must be signed by its sender and name peers")
    return taken


@dataclass(frozen=True)
class Empty:
    """A leader's word to its parent that its collector closed with nothing in it: every member's
    work went past it, or none came, and its own update is not in. Without the word the parent
    waited for the leader until its own deadline: at a thousand simulated members, leaders
    whose groups had all gone past them held round 1 until the root's deadline."""

    job: str
    round: int
    attempt: int
    plan: str  # the digest of the plan
    leader: str  # the signer
    env: Envelope


def parse_empty(env: Envelope) -> Empty:
    b, what = env.body, "empty notice"
    empty = Empty(*_attempt_of(b, what), leader=read_field(b, "leader", str, what), env=env)
    if empty.leader != env.sender:
        raise WireError(WireReason.GARBLED, "empty notice must be signed by its leader")
    return empty
