"""The job option ``pause_s``: every node rests that long after a commit before it takes up the
next round. On the fake transport under MockClock, with the real drivers and roles."""

from __future__ import annotations

import pytest

from gpuflex.jobspec import MAX_TIMEOUT_S, JobSpec, JobSpecError
from gpuflex.node.core.kinds import EventKind
from tests.unit.node.fakenet import FakeNet, fast_spec

pytestmark = pytest.mark.timeout(60)
PAUSE_S = 30.0
ROUNDS = 4


async def rounds_of(tmp_path, pause_s: float) -> FakeNet:
    net = FakeNet(tmp_path, 3, fast_spec(rounds=ROUNDS, min_nodes=3, pause_s=pause_s))
    assert [r.round for r in await net.run_rounds(ROUNDS)] == list(range(1, ROUNDS + 1))
    return net


def rests(net: FakeNet) -> list[float]:
    """Per round after the first: from the last node's commit of the round before to the first
    plan of this one, on any node."""
    nodes = net.alive_nodes()
    committed = {r: max(e.at for n in nodes for e in n.events if e.kind == EventKind.ROUND_COMMITTED and e.round == r)
                 for r in range(1, ROUNDS)}
    planned = {r: min(e.at for n in nodes for e in n.events if e.kind == EventKind.PLAN_RECEIVED and e.round == r)
               for r in range(2, ROUNDS + 1)}
    return [planned[r] - committed[r - 1] for r in range(2, ROUNDS + 1)]


async def test_every_round_waits_out_the_pause_and_commits(autojump_clock, tmp_path) -> None:
    paced, unpaced = rests(await rounds_of(tmp_path / "on", PAUSE_S)), rests(await rounds_of(tmp_path / "off", 0.0))
    assert min(paced) >= PAUSE_S - 1.0, paced  # nodes commit within a second of each other here
    assert max(unpaced) < PAUSE_S / 2, unpaced  # without it the next plan comes at once


@pytest.mark.parametrize("value", [-1.0, MAX_TIMEOUT_S + 1, float("nan"), "soon"])
def test_the_job_file_bounds_the_pause(value) -> None:
    with pytest.raises(JobSpecError, match="pause_s"):
        JobSpec.from_dict({"model": "digits-cnn", "data": "sklearn-digits", "pause_s": value})
