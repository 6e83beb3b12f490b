"""The root of every error gpuflex raises on purpose.

Each subclass says what happened and keeps the builtin base it had (``ValueError`` for bad
input, ``RuntimeError`` for a failed operation), so callers that caught those still work and
callers that want to tell gpuflex's own failures from bugs catch ``GpuflexError``.
"""

from __future__ import annotations


class GpuflexError(Exception):
    """Something gpuflex detected and reports with a message meant for its user."""
