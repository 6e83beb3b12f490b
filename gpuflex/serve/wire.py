"""The serving messages between nodes (signed envelopes, bounded per kind)."""

from __future__ import annotations

from mesh.codec import register_kind

#: A streamed generation request (``mesh.streaming``): a GenRequest's fields.
INFER = "serve_infer"
#: A serving node's models, capacity and load, gossiped one hop every second.
SERVE_LOAD = "serve_load"
register_kind(INFER, 1 << 20)
register_kind(SERVE_LOAD, 8 * 1024)
#: A server's signed record of one answer: the request's digest, the text, the model hash.
SERVE_OUTPUT = "serve_output"
register_kind(SERVE_OUTPUT, 1 << 20)
