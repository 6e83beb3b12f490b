"""Whose turn it is, when peers cannot tell alike: a candidate behind NAT says it passes its
turns, and a held plan for a later attempt passes over only a candidate this node cannot hear.

A later candidate must never pre-empt an earlier one that is live here (docs/security.md,
"Committed rounds and fork choice"): these check the two new reasons to skip a turn on their
own, at the edge where each must not apply. The round protocol test of the NAT topology
(test_round_protocol.py) checks what they buy.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio
import trio.testing

from gpuflex.node.clock import DeadlineClock
from gpuflex.node.core.messages import JOB
from gpuflex.node.roles.turns import Turns
from gpuflex.node.state import PRESENCE_FRESH_S, JobBook, JobInfo
from mesh.codec import open_envelope, seal
from mesh.health import PeerState
from mesh.identity import Identity
from tests.unit.node.fakenet import fast_spec


class TurnPort:
    """What whose-turn decisions read of a port: health and who is behind NAT, as this node knows."""

    def __init__(self, up: set[str], private: set[str]) -> None:
        self.up, self.private = up, private
        self.clock = DeadlineClock()

    def health(self, peer: str) -> PeerState | None:
        return PeerState.UP if peer in self.up else PeerState.DOWN

    def private_peers(self) -> set[str]:
        return set(self.private)

    def behind_nat(self, peer: str) -> bool:
        return peer in self.private


def book_of(tmp_path: Path, me: str, members: list[str]) -> JobBook:
    owner = Identity(bytes([9]) * 32)
    spec = fast_spec(min_nodes=2)
    frame = seal(owner, JOB, {"spec": spec.to_dict(), "members": members, "created": 0})
    info = JobInfo(job_id=open_envelope(frame).digest[:16], spec=spec, initial_members=tuple(sorted(members)),
                   frame=frame, submitted_by=owner.peer_id)
    return JobBook(info, me, tmp_path / "job")


def test_a_home_passes_its_turns_only_while_a_reachable_candidate_is_up(tmp_path: Path) -> None:
    home, public, other = (Identity(bytes([i]) * 32).peer_id for i in (1, 2, 3))
    port = TurnPort(up={public, other}, private={home, other})

    async def main() -> None:
        turns = Turns(cast(Any, port), book_of(tmp_path, home, [home, public, other]))
        assert turns.passes_own_turns(), "behind NAT with a public candidate up: it passes"
        port.up.discard(public)  # no reachable candidate left: a home must plan after all
        assert not turns.passes_own_turns()
        port.up.add(public)
        port.private.discard(home)  # reachable itself: it plans its turns
        assert not turns.passes_own_turns()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_held_later_plan_passes_over_only_a_candidate_not_heard_for_a_while(tmp_path: Path) -> None:
    me, earlier, later = (Identity(bytes([i]) * 32).peer_id for i in (1, 2, 3))
    port = TurnPort(up={earlier, later}, private=set())

    async def main() -> None:
        book = book_of(tmp_path, me, [me, earlier, later])
        turns = Turns(cast(Any, port), book)
        rs = book.current
        assert not turns.passed_over(earlier, rs, 0), "no later plan held"
        rs.hold(cast(Any, SimpleNamespace(round=rs.round, attempt=2)))
        # A new job: nobody is silent before presence has had time to come at all.
        assert not turns.passed_over(earlier, rs, 0)
        await trio.sleep(PRESENCE_FRESH_S / 2)
        book.saw_presence(earlier)
        await trio.sleep(PRESENCE_FRESH_S * 0.9)
        assert not turns.passed_over(earlier, rs, 0), "heard within PRESENCE_FRESH_S: waited for"
        assert turns.passed_over(later, rs, 1), "never heard, the job long under way: passed over"
        assert not turns.passed_over(earlier, rs, 2), "the held plan is not for a later attempt"
        await trio.sleep(PRESENCE_FRESH_S * 0.2)
        assert turns.passed_over(earlier, rs, 0), "silent for PRESENCE_FRESH_S: passed over"
        assert not turns.passed_over(me, rs, 0), "this node never passes itself over"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
