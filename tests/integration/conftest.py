from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuflex.localmesh import LocalMesh
from gpuflex.testing.netns import NetnsPair, NetnsUnavailable


@pytest.fixture
def mesh_factory(tmp_path: Path) -> Iterator:
    """Starts LocalMesh instances that are always torn down, even when a test fails."""
    meshes: list[LocalMesh] = []

    def make(size: int, **kwargs: object) -> LocalMesh:
        mesh = LocalMesh(tmp_path / f"mesh{len(meshes)}", size, **kwargs)  # type: ignore[arg-type]
        meshes.append(mesh)
        return mesh

    yield make
    for mesh in meshes:
        mesh.close()


@pytest.fixture
def netns_pair() -> Iterator[NetnsPair]:
    """Two network namespaces joined by a veth; skipped where they cannot be made (not root).
    Request it before ``mesh_factory`` so that the nodes inside are stopped first."""
    try:
        pair = NetnsPair()
    except NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    try:
        yield pair
    finally:
        pair.close()


@pytest.fixture
def small_tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """Mounts small tmpfs file systems (a disk that fills up) and always unmounts them.
    Request it before ``mesh_factory`` so that the nodes using them are stopped first."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=20)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        with contextlib.suppress(subprocess.TimeoutExpired):
            if subprocess.run(["umount", str(path)], capture_output=True, timeout=20).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)


def digits_spec(**overrides: object) -> dict:
    from gpuflex.demo import demo_spec

    spec = demo_spec(int(overrides.pop("rounds", 4)))  # type: ignore[arg-type]
    spec.update(overrides)
    return spec


def light_spec(**overrides: object) -> dict:
    """The demo job with a small MLP in place of its CNN: for a test that needs rounds to
    commit (a ledger to compare after kills, a partition, a full disk), not a model worth
    training. A step of local training then costs about a fifth of the CPU, so rounds are also
    shorter: a test whose checks need a round still open at some moment keeps the CNN."""
    return digits_spec(**{"model": "mlp", **overrides})


#: The honest job that runs beside an attack for a whole module: it must keep committing, not
#: train flat out. Unpaced, its two nodes committed two rounds a second and took a core and more
#: between them for minutes, which the attacks and the checks beside it then lacked; paced at
#: 1 s they still took 0.4 of a core (a round costs each node about 0.3 CPU s), in seven modules
#: of the suite. At 3 s it is a round every 3 to 4 s, which every check of "keeps committing"
#: needs by far.
HONEST_PACE = {"pause_s": 3.0}


def load_factor() -> float:
    """How many times slower than idle this machine runs now: the one-minute load per core,
    between 1 and 4. Discovery and failure detection are bounded by CPU (every node process
    walks the DHT and answers pings), so a budget that holds on an idle 2-core machine is
    scaled by this on a shared, busy one instead of flaking."""
    return min(4.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def scaled_wait(mesh: LocalMesh, default_s: float) -> Callable[..., None]:
    """``wait(predicate, what, timeout=default_s)``: poll ``mesh`` every 0.2 s until
    ``predicate`` holds, for ``timeout`` seconds scaled by the machine's load (``load_factor``)."""

    def wait(predicate: Callable[[], bool], what: str, timeout: float = default_s) -> None:
        mesh.wait_until(predicate, timeout * load_factor(), interval=0.2, what=what)

    return wait
