"""The portal's view of the control API's JSON: the model it shares with the dashboard
(gpuflex.client.model), and how an id and a size read on a page.

Parsing is lenient there: a missing, null or mistyped field becomes ``None`` (shown as "—" or
"unknown"), never an exception. Every string from the node can come from a peer, so the model
clips each to a bound; escaping is the templates' job (Jinja autoescape).
"""

from __future__ import annotations

from gpuflex.cli.common import human_bytes as cli_bytes
from gpuflex.client.model import (
    MAX_TEXT,
    MEMBER_FIELDS,
    Event,
    Job,
    LedgerRound,
    Peer,
    Status,
    as_list,
)
from gpuflex.safetext import SHORT_ID_CHARS

__all__ = ["MAX_TEXT", "MEMBER_FIELDS", "Event", "Job", "LedgerRound", "Peer", "Status", "as_list", "human_bytes",
           "short"]


def short(peer: str, n: int = SHORT_ID_CHARS) -> str:
    return "—" if not peer else (peer if len(peer) <= n + 1 else f"…{peer[-n:]}")


def human_bytes(n: float | None) -> str:
    return cli_bytes(n) if n else "—"
