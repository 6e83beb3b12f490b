"""A real network partition, with real node processes in two network namespaces the test
makes: the minority waits and says why, the majority commits on, and after the cut heals every
node holds one ledger. Its own file so that it runs beside the other fault tests
(tests/integration/test_faults.py), not after them: it is the longest of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuflex.node.core.ledger import verify_chain
from gpuflex.testing.netns import NetnsPair
from tests.integration.conftest import light_spec
from tests.integration.test_faults import FAST, ledger_frames, peer_ids, wait_round

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

PARTITION_ROUNDS = 12


def test_partition_minority_waits_and_says_so_then_all_agree(netns_pair: NetnsPair, mesh_factory) -> None:
    majority, minority = [0, 1, 2, 3], [4, 5]
    sides = {i: netns_pair.a if i in majority else netns_pair.b for i in range(6)}
    mesh = mesh_factory(6, placement=lambda i: sides[i].placement())
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    ids = peer_ids(mesh, range(6))
    # Enough rounds that the majority can commit two more after the cut however late the cut
    # lands: on a loaded machine the minority had reached round 5 of 6 before it took effect.
    job = mesh.submit(light_spec(rounds=PARTITION_ROUNDS, min_nodes=4, **FAST))

    def level() -> bool:  # every node has fetched the same round's model: no download is cut
        held = {mesh.job(i, job)["round"] for i in range(6)}
        return len(held) == 1 and held.pop() >= 1

    mesh.wait_until(level, 120, interval=0.1, what="all nodes at the same round")
    netns_pair.partition()
    mesh.wait_until(lambda: all("of min_nodes=4" in mesh.job(i, job)["waiting"] for i in minority), 60,
                    interval=0.5, what="the minority saying it cannot reach min_nodes")
    stuck = [mesh.job(i, job)["round"] for i in minority]
    last = max(stuck)
    assert last + 2 <= PARTITION_ROUNDS, f"the cut took effect only at round {last}"
    wait_round(mesh, 0, job, last + 2, timeout=120)  # the majority commits on
    # A minority node may still take, from the other, a round committed before the cut (one run
    # read [2, 1], then [2, 2]); no round past those is committed on its side.
    held = [mesh.job(i, job)["round"] for i in minority]
    assert all(s <= h <= last for s, h in zip(stuck, held, strict=True)), \
        f"the minority committed while cut off: {held}"
    for i in minority:
        assert "waiting, only" in mesh.log_path(i).read_text(errors="replace")
    shown = subprocess.run([*sides[4].placement().prefix, sys.executable, "-m", "gpuflex", "job", "status", job,
                            "--node", str(mesh.home(4))], capture_output=True, text=True, timeout=60)
    assert "waiting      only" in shown.stdout, shown.stdout + shown.stderr
    healed_at = mesh.job(0, job)["round"]

    netns_pair.heal()
    # All agree: once the minority is past the round the majority was at when the cut healed,
    # every node holds the same chain up to there, each round with its evidence. The job goes
    # on; what it commits later is every round's business, checked by the other fault tests.
    caught_up = healed_at + 1
    mesh.wait_until(lambda: all(mesh.job(i, job)["round"] >= caught_up for i in range(6)), 240, interval=0.5,
                    what=f"every node past round {healed_at}")
    frames = [ledger_frames(mesh, i, job)[:caught_up] for i in range(6)]
    assert all(f == frames[0] for f in frames), "ledgers differ between nodes"
    assert [r.round for r in verify_chain(frames[0], job)] == list(range(1, caught_up + 1))
    rows = mesh.call(0, "ledger", {"job": job})
    side_a = {p for p, i in ids.items() if i in majority}
    # Rounds after last + 1 were planned on ledgers the minority did not have.
    assert healed_at >= last + 2
    for row in rows[last + 1 : healed_at]:
        assert {c["peer"] for c in row["contributors"]} <= side_a
    assert all("of min_nodes=4" not in mesh.job(i, job)["waiting"] for i in minority)
