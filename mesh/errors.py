"""The root of every error the mesh raises on purpose.

An embedding program catches ``MeshError`` to tell the mesh's own failures (bad input from a
peer, a message that could not be delivered, a blob that could not be fetched) from bugs.
Each subclass keeps the builtin base it had before (``ValueError``, ``RuntimeError``,
``OSError``), so code that caught those still works.
"""

from __future__ import annotations


class MeshError(Exception):
    """Something the mesh layer detected and reports; never a bug in the caller."""
