"""The GPUFlex web portal: join, watch and credit a mesh from a browser.

Like the terminal dashboard (``tui/``), it is a client of one node's local control API
(docs/control-api.md) and nothing else: it holds no state of its own beyond a cache of the
files that ``job_results`` writes for downloads and audits. It runs on trio, served by
Hypercorn's trio worker, so it shares the node's concurrency model.
"""

from __future__ import annotations


class WebError(Exception):
    """The root of the portal's own errors (a bad --listen, an unusable token file)."""
