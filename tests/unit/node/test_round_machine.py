"""A hypothesis state machine drives random message delays (and so orders), deaths and slow
trainings through the real round protocol on the fake transport, under a mock clock.

Rules act on a live mesh: time only moves when a rule advances it, so deaths and slow-downs
land at arbitrary points of a round. Rules have no preconditions on the mesh's state (a kill
with nobody left to kill does nothing), so what hypothesis draws never depends on it. The invariants:

- one ledger: every live node ends with the same verified chain;
- hierarchical mean equals flat mean: every committed model is exactly the sample-weighted
  FedAvg of its contributors' deltas (or, for a FedNova job, the step-normalised FedNova
  formula; the fake members take unequal steps), whatever the tree and the order updates
  arrived in;
- kept plans are live: no plan a node keeps for later (held ahead, or behind: an earlier
  attempt its peers are in, kept while it ran ahead) is for an attempt its coordinator aborted;
- no accepted update lost: an update that a leader acknowledged in the attempt that
  committed is in that round's result, unless both the member and the node that
  acknowledged it died.

The trio loop runs in the test's thread with the mock clock frozen (autojump off); the
machine runs in a worker thread and calls into the loop. ``advance`` lets the clock jump
through every pending deadline up to its target, in order, and freezes it again.

A node can be made deaf for a while (messages to it are held back, as for a node that was
restarting): it gives up waiting for plans it does not hear and runs ahead on attempts, and
must come back to the attempt its peers are in.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from gpuflex.node.core.kinds import JobState
from gpuflex.node.core.ledger import verify_chain
from tests.unit.node.fakenet import FakeNet, FakeNode, fast_spec, jittered

pytestmark = pytest.mark.timeout(120)
#: Timings under which an accepted update can always be re-sent in time: deaths are noticed
#: within DETECT_S, well inside one reduce slack, and messages take at most MAX_DELAY_S.
DETECT_S, SLACK_S, MAX_DELAY_S = 1.0, 5.0, 0.5
SETTLE_S = 600.0  # enough mock time for any surviving mesh to finish or give up


class Harness:
    """The trio side: starts a net per example and moves the mock clock on request."""

    def __init__(self, nursery: trio.Nursery, clock: trio.testing.MockClock, tmp: Path) -> None:
        self.nursery, self.clock, self.tmp = nursery, clock, tmp
        self.examples = itertools.count()
        self.scope: trio.CancelScope | None = None

    async def start(self, size: int, group: int, seed: int, rounds: int, train_s: float,
                    fednova: bool = False, deaf_until: dict[str, float] | None = None,
                    deaf: tuple[int, float] = (0, 0.0)) -> FakeNet:
        """``deaf_until``: peer -> mock time until which messages to it are held back; ``deaf``:
        (pick, seconds) one node starts deaf for (it misses round 1's first plan)."""
        spec = fast_spec(rounds=rounds, group_size=group, min_nodes=2, reduce_timeout_s=SLACK_S,
                         normalization="fednova" if fednova else "none")
        net = FakeNet(self.tmp / f"ex{next(self.examples)}", size, spec, detect_s=DETECT_S,
                      jitter=jittered(seed, 0.0, MAX_DELAY_S))
        for node in net.nodes.values():  # unequal speeds: leaders wait for their slower members
            node.train_s = train_s * (1 + node.index % 3)
        if deaf_until is not None:
            jitter = net.jitter

            def held_back(a: FakeNode, b: FakeNode) -> float:
                return jitter(a, b) + max(0.0, deaf_until.get(b.peer_id, 0.0) - trio.current_time())

            net.jitter = held_back
            if deaf[1]:
                deaf_until[net.order[deaf[0] % size]] = trio.current_time() + deaf[1]

        async def run(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                self.scope = scope
                async with trio.open_nursery() as nursery:
                    await net.start(nursery)
                    task_status.started()
                    await trio.sleep_forever()

        await self.nursery.start(run)
        return net

    async def advance(self, seconds: float) -> None:
        self.clock.autojump_threshold = 0
        try:
            await trio.sleep(seconds)
        finally:
            self.clock.autojump_threshold = math.inf

    async def settle(self, net: FakeNet) -> None:
        """Let the mesh run until every live node has finished the job (or SETTLE_S passed)."""
        for _ in range(int(SETTLE_S / 10)):
            if all(n.driver.state != JobState.RUNNING and n.driver.state != JobState.PENDING
                   for n in net.alive_nodes()):
                break
            await self.advance(10.0)
        await self.advance(10.0)  # results in flight land, and catch-up finishes

    async def stop(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
            self.scope = None
        await trio.testing.wait_all_tasks_blocked()


class RoundMachine(RuleBasedStateMachine):
    harness: ClassVar[Harness]

    def __init__(self) -> None:
        super().__init__()
        self.net: FakeNet | None = None
        self.killed: set[str] = set()
        self.deaf_until: dict[str, float] = {}  # peer -> mock time until which it hears nothing

    def call(self, afn: Any, *args: Any) -> Any:
        return trio.from_thread.run(afn, *args)

    @initialize(size=st.integers(3, 6), group=st.integers(2, 4), seed=st.integers(0, 2**16),
                rounds=st.integers(1, 3), train_s=st.floats(0.5, 4.0), fednova=st.booleans(),
                deaf=st.integers(0, 63), deaf_s=st.sampled_from([0.0, 0.0, 4.0, 7.0, 10.0]))
    def start(self, size: int, group: int, seed: int, rounds: int, train_s: float, fednova: bool,
              deaf: int, deaf_s: float) -> None:
        """``deaf_s``: one node starts deaf for that long (it misses round 1's first plan)."""
        self.net = self.call(self.harness.start, size, group, seed, rounds, train_s, fednova, self.deaf_until,
                             (deaf, deaf_s))

    @rule(seconds=st.floats(0.05, 6.0))
    def advance(self, seconds: float) -> None:
        self.call(self.harness.advance, seconds)

    @rule(pick=st.integers(0, 63))
    def kill(self, pick: int) -> None:
        assert self.net is not None
        alive = self.net.alive_nodes()
        if len(alive) > 1:
            self.kill_node(alive[pick % len(alive)])

    def _holders(self) -> list[FakeNode]:
        """Live leaders holding someone's update they have not passed up yet: killing one
        is what re-sending is for."""
        assert self.net is not None
        net = self.net
        held = {acceptor for r, a, _, acceptor in net.acks
                if (r, a, acceptor) not in net.forwarded and net.roots.get((r, a)) != acceptor}
        return [n for n in net.alive_nodes() if n.peer_id in held]

    @rule(pick=st.integers(0, 63))
    def kill_a_holder(self, pick: int) -> None:
        holders = self._holders()
        if holders and len(self.net.alive_nodes()) > 1:
            self.kill_node(holders[pick % len(holders)])

    def kill_node(self, victim: FakeNode) -> None:
        assert self.net is not None
        self.killed.add(victim.peer_id)
        trio.from_thread.run_sync(self.net.kill, victim)

    @rule(pick=st.integers(0, 63), seconds=st.floats(0.0, 20.0))
    def slow_training(self, pick: int, seconds: float) -> None:
        """The node's next local training takes ``seconds`` (beyond 12 it misses its deadline)."""
        assert self.net is not None
        nodes = list(self.net.nodes.values())
        nodes[pick % len(nodes)].train_delays.append(seconds)

    @rule(pick=st.integers(0, 63), seconds=st.floats(1.0, 10.0))
    def deafen(self, pick: int, seconds: float) -> None:
        """The node hears nothing for ``seconds``: it misses plans and runs ahead on attempts."""
        assert self.net is not None
        node = list(self.net.nodes.values())[pick % len(self.net.nodes)]

        def deafen_now() -> None:
            self.deaf_until[node.peer_id] = trio.current_time() + seconds

        trio.from_thread.run_sync(deafen_now)

    @invariant()
    def kept_plans_are_live(self) -> None:
        if self.net is None:
            return
        for node in self.net.alive_nodes():
            rs = node.driver.book.current
            kept = [*rs.held.values(), *([rs.behind] if rs.behind is not None else [])]
            assert not [p.attempt for p in kept if p.attempt in rs.aborted], \
                f"node {node.index} keeps a plan for an aborted attempt of round {rs.round}"

    @invariant()
    def hierarchical_mean_equals_flat_mean(self) -> None:
        if self.net is None:
            return
        for node in self.net.alive_nodes():
            for r in range(1, node.driver.committed + 1):
                np.testing.assert_allclose(self.net.committed_model(node, r), self.net.expected_model(node, r),
                                           atol=1e-5, err_msg=f"round {r} on node {node.index}")

    def teardown(self) -> None:
        if self.net is None:
            return
        try:
            self.call(self.harness.settle, self.net)
            self.check_one_ledger()
            self.hierarchical_mean_equals_flat_mean()
            self.check_no_accepted_update_lost()
        finally:
            self.call(self.harness.stop)

    def check_one_ledger(self) -> None:
        assert self.net is not None
        alive = self.net.alive_nodes()
        ledgers = {tuple(self.net.ledger(n)) for n in alive}
        assert len(ledgers) == 1, f"{len(ledgers)} different ledgers among {len(alive)} live nodes"
        verify_chain(list(ledgers.pop()), self.net.info.job_id)

    def check_no_accepted_update_lost(self) -> None:
        net = self.net
        assert net is not None
        node: FakeNode = net.alive_nodes()[0]
        for res in node.driver.book.ledger.results:
            included = {c["peer"] for c in res.contributors}
            for round_, attempt, member, acceptor in net.acks:
                if (round_, attempt) != (res.round, res.attempt):
                    continue
                if member in self.killed and acceptor in self.killed:
                    continue  # the update and every copy of it died
                assert member in included, (
                    f"round {res.round} attempt {res.attempt}: {member[-8:]}'s update, accepted by "
                    f"{acceptor[-8:]}, is missing\n{net.dump()}")


def test_random_orders_deaths_and_delays_keep_one_ledger_and_every_accepted_update(tmp_path: Path) -> None:
    clock = trio.testing.MockClock(autojump_threshold=math.inf)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            RoundMachine.harness = Harness(nursery, clock, tmp_path)
            machine_settings = settings(max_examples=15, stateful_step_count=8, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
            await trio.to_thread.run_sync(
                lambda: run_state_machine_as_test(RoundMachine, settings=machine_settings))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
