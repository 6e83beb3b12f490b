"""Finding a running node: its control files in its home directory."""

from __future__ import annotations

import json
import os

from gpuflex.client.core import ControlError, Endpoint, Unreachable
from gpuflex.home import CONTROL_FILE, TOKEN_FILE, resolve_home


def locate(home: str | os.PathLike[str] | None = None) -> Endpoint:
    """Find a running node's API from the files in its home directory."""
    root = resolve_home(home)
    info_path = root / CONTROL_FILE
    try:
        info = json.loads(info_path.read_text())
        token = (root / TOKEN_FILE).read_text().strip()
    except FileNotFoundError:
        raise Unreachable(f"no node is running for home {root} (start one with 'gpuflex node start')") from None
    except (OSError, ValueError) as exc:
        raise ControlError(f"cannot read the control files in {root}: {exc}") from None
    return Endpoint(str(info.get("host", "127.0.0.1")), int(info["port"]), token, root)
