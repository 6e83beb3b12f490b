"""What every hostile-peer test checks of the honest job running beside the attack: it keeps
committing, and every node holds one and the same verified chain of its rounds."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from gpuflex.localmesh import LocalMesh
from gpuflex.node.core.ledger import Ledger, verify_chain


def committed(mesh: LocalMesh, job: str, nodes: Sequence[int] = (0, 1)) -> int:
    """The round every one of ``nodes`` has committed."""
    return min(int(mesh.job(i, job)["round"]) for i in nodes)


def keeps_committing(mesh: LocalMesh, job: str, since: int, nodes: Sequence[int] = (0, 1),
                     timeout: float = 120) -> None:
    """Every one of ``nodes`` commits a round after round ``since`` (the attack's start)."""
    mesh.wait_until(lambda: committed(mesh, job, nodes) > since, timeout, interval=0.5,
                    what=f"the honest job committing past round {since}")


def assert_one_ledger(mesh: LocalMesh, job: str, nodes: Sequence[int], at_least: int) -> None:
    """The nodes are alive and hold one chain of committed rounds, as far as each has got."""
    assert all(mesh.alive(i) for i in nodes), f"a node died: see {mesh.base}"
    frames = []
    for i in nodes:
        ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
        assert ledger.load() == []
        frames.append(ledger.frames)
    common = min(map(len, frames))
    assert common >= at_least, f"only {common} rounds committed through the attacks"
    assert all(f[:common] == frames[0][:common] for f in frames), "the nodes hold different ledgers"
    assert [r.round for r in verify_chain(frames[0], job)] == list(range(1, len(frames[0]) + 1))


def assert_paced(mesh: LocalMesh, job: str, node: int, pause_s: float) -> None:
    """The job's ``pause_s`` held: each committed round's result was signed at least that long
    after the previous one's, since every node rests that long after a commit before it plans
    or trains the next round."""
    ledger = Ledger(mesh.home(node) / "jobs" / job / "ledger.msgpack", job)
    assert ledger.load() == []
    stamps = [r.env.ts for r in ledger.results]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert len(gaps) >= 2, f"only {len(stamps)} rounds to compare"
    assert min(gaps) >= pause_s, f"a round committed {min(gaps):.2f} s after the one before (pause {pause_s} s)"
