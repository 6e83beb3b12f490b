"""Where a node keeps its state.

One directory per node holds its key, token, jobs, ledgers and models, so several nodes can
share a machine (tests, the demo) by pointing each at its own home.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = "~/.gpuflex"


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """``--home`` wins over ``GPUFLEX_HOME``, which wins over ``~/.gpuflex``."""
    chosen = home if home else os.environ.get("GPUFLEX_HOME") or DEFAULT_HOME
    return Path(chosen).expanduser().resolve()


KEY_FILE = "identity.key"
TOKEN_FILE = "control.token"
CONTROL_FILE = "control.json"
LOG_FILE = "node.log"
PEERS_FILE = "peers.json"  # the address book: peers met, kept across restarts (mesh.addressbook)
