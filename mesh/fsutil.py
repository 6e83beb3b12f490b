"""Crash-safe file writes.

A node may be killed at any instant (kill -9, power loss, full disk). Every state file is
therefore written to a temporary sibling, flushed, fsynced and renamed over the target, so a
reader sees either the old file or the new one, never a torn mix.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from mesh.errors import MeshError


class StateWriteError(MeshError, OSError):
    """A state file could not be written; the previous version is still intact."""


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically, leaving the old file intact on failure."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StateWriteError(exc.errno, f"could not write {target}: {exc.strerror or exc}") from exc
    with contextlib.suppress(OSError):
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o600) -> None:
    """Text flavour of :func:`atomic_write` (UTF-8)."""
    atomic_write(path, text.encode("utf-8"), mode)
