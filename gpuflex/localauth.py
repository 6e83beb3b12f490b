"""Who may use a service that listens on this machine: a loopback client, or one holding the
service's token, which is made once and kept in a file of mode 0600.

The control API, the serving endpoint (``gpuflex.serve.http``) and the portal
(``gpuflex_web.security``) each keep a token file of their own, with this one rule for making
and reading it, and answer token-less only where they listen on loopback.
"""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path

from mesh.fsutil import atomic_write_text

#: Host names that mean this machine, besides the loopback addresses themselves.
LOOPBACK_NAMES = frozenset({"localhost"})
#: A token is 32 random bytes in hex.
TOKEN_CHARS = 64


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an IPv4 or IPv6 address, bracketed or not) is this machine
    alone; an empty or unknown name is not."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_or_create_token(path: Path) -> str:
    """The token kept in ``path``: read if it holds one (and its mode set to 0600 again),
    else made and written atomically with mode 0600. Raises OSError."""
    if path.exists():
        token = path.read_text().strip()
        if len(token) == TOKEN_CHARS:
            path.chmod(0o600)
            return token
    token = secrets.token_hex(TOKEN_CHARS // 2)
    atomic_write_text(path, token + "\n", mode=0o600)
    return token
