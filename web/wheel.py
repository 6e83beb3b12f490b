"""The node's own wheel, offered on the Join page so that a friend installs the same version.

The portal never takes a path from a request: it looks for exactly one file name,
``gpuflex-<version>-py3-none-any.whl`` for the version it runs, in a fixed list of folders (the
``dist/`` that ``just dist`` fills in the source copy this portal runs from, and ``<home>/dist``
where an operator can put it), and serves that file read-only, with its SHA-256 so the friend
can check what arrived.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: The source copy the portal runs from: its dist/ is where `just dist` writes the wheel.
SOURCE_DIST = Path(__file__).resolve().parents[1] / "dist"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str
    size: int
    sha256: str


def wheel_name(version: str) -> str:
    return f"gpuflex-{version}-py3-none-any.whl"


def wheel_dirs(home: Path) -> tuple[Path, ...]:
    """Where a node's wheel may be, first match wins."""
    return (SOURCE_DIST, home / "dist")


class WheelFinder:
    """Finds the wheel of ``version`` in ``dirs``; hashes it once per (size, mtime)."""

    def __init__(self, version: str, dirs: Sequence[Path]) -> None:
        self.name = wheel_name(version) if version else ""
        self.dirs = tuple(dirs)
        self._lock = threading.Lock()
        self._cache: dict[tuple[Path, int, int], Wheel] = {}

    def find(self) -> Wheel | None:
        """The wheel, or None when no folder holds a regular file of that name (blocking I/O)."""
        if not self.name:
            return None
        for folder in self.dirs:
            path = folder / self.name
            try:
                st = path.stat()
            except OSError:
                continue
            if not path.is_file():
                continue
            key = (path, st.st_size, st.st_mtime_ns)
            with self._lock:
                if key not in self._cache:
                    self._cache = {key: Wheel(path, self.name, st.st_size, _sha256(path))}
                return self._cache[key]
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
