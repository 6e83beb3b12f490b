"""The node launcher: a forked node must behave like one started with ``python -m``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuflex import forkserver

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")

# Writes to a socket whose peer has closed: Python raises BrokenPipeError (EPIPE); with SIGPIPE
# at its default the process would be killed by the signal instead.
WRITER = """
import socket, sys
a, b = socket.socketpair()
b.close()
try:
    for _ in range(100):
        a.send(b"x" * 65536)
except BrokenPipeError:
    sys.exit(7)
sys.exit(1)
"""


def test_a_forked_child_gets_epipe_not_sigpipe_when_its_peer_has_gone(tmp_path: Path) -> None:
    """The launcher's child set-up (``_child``) run in a fork of this process: the same code
    path as a launched node, without the launcher's seconds of imports."""
    (tmp_path / "epipe_writer.py").write_text(WRITER)
    req = {"argv": [], "env": {**os.environ, "PYTHONPATH": str(tmp_path)}, "log": str(tmp_path / "child.log"),
           "cwd": str(tmp_path), "module": "epipe_writer"}
    pid = os.fork()
    if pid == 0:
        forkserver._child(req)  # never returns: os._exit with the module's status
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code == 7, f"exit {code} ({sys.platform}): {(tmp_path / 'child.log').read_text(errors='replace')[-500:]}"
