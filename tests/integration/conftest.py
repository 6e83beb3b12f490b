from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflex.localmesh import LocalMesh


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


def digits_spec(**overrides: object) -> dict:
    from gpuflex.demo import demo_spec

    spec = demo_spec(int(overrides.pop("rounds", 4)))  # type: ignore[arg-type]
    spec.update(overrides)
    return spec
