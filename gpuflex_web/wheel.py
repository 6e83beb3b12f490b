"""The node's own wheel, offered on the Join page so that a friend installs the same version.

The portal never takes a path from a request: it looks for exactly one file name,
``gpuflex-<version>-py3-none-any.whl`` for the version it runs, in a fixed list of folders, and
serves that file read-only, with its SHA-256 so the friend can check what arrived. The folders:
the ``dist/`` that ``just dist`` fills in the source copy this portal runs from; next to the
install, the folder of the wheel pip installed GPUFlex from (or the ``dist/`` of an editable
install's source), as pip's ``direct_url.json`` records it; and ``<home>/dist``, where an
operator can put it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

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
    return tuple(dict.fromkeys((SOURCE_DIST, *install_dirs(), home / "dist")))


def install_dirs() -> tuple[Path, ...]:
    """The folder pip's record of this install points at: the local wheel it was installed from,
    or an editable install's source ``dist/``; none for an install from an index."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        record = json.loads(distribution("gpuflex").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, OSError, ValueError):
        return ()
    url = urlparse(str(record.get("url", ""))) if isinstance(record, dict) else None
    if url is None or url.scheme != "file" or url.netloc not in ("", "localhost"):
        return ()
    where = Path(url2pathname(url.path))
    if "archive_info" in record:
        return (where.parent,)
    return (where / "dist",) if "dir_info" in record else ()


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
