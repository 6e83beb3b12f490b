"""Serving what the mesh trained: models loaded by the operator's choice, batched on each
serving node, routed over the mesh, behind an OpenAI-compatible HTTP API (docs/serving.md).

Nothing here takes a module, a file path or a model location from a peer: a peer names a
served model by the short name its operator gave it, and every size it sends is bounded.
"""

from __future__ import annotations

from gpuflex.errors import GpuflexError


class ServeError(GpuflexError):
    """A serving failure with a message meant for the user (or the API's caller)."""

    status = 500  # the HTTP status the API answers with

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class BadRequest(ServeError, ValueError):
    """The caller's request is malformed or out of bounds."""

    status = 400


class UnknownModel(ServeError, LookupError):
    """No node this one knows serves the named model."""

    status = 404


class Overloaded(ServeError):
    """Every server of the model is at its queue limit; try again shortly."""

    status = 429
