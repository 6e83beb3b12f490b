"""Stopping ``gpuflex node start`` the ways people do: Ctrl-C in its terminal, SIGTERM from a
service manager. Either way: a line that says so, no traceback, a clean exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def start_node(home: Path) -> tuple[subprocess.Popen[str], list[str], threading.Event]:
    """A real node process on loopback; its stderr lines collected, ``ready`` set once its
    control API is up (the last thing it logs at start)."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuflex", "node", "start", "--home", str(home),
                             "--listen", "/ip4/127.0.0.1/tcp/0", "--no-mdns"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "control API on" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, ready


def stop_with(home: Path, sig: int) -> tuple[int, list[str]]:
    proc, lines, ready = start_node(home)
    try:
        assert ready.wait(120), "\n".join(lines)
        started = len(lines)
        proc.send_signal(sig)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.2)  # the reader thread drains the closed pipe
    return code, lines[started:] if code is not None else lines


def test_ctrl_c_stops_the_node_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    code, after = stop_with(tmp_path, signal.SIGINT)
    text = "\n".join(after)
    assert code == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "ExceptionGroup" not in text
    assert any("Ctrl-C received: stopping the node" in line for line in after), text
    assert len(after) <= 4, text


def test_sigterm_says_the_node_stopped(tmp_path: Path) -> None:
    code, after = stop_with(tmp_path, signal.SIGTERM)
    text = "\n".join(after)
    assert code == 0, text
    assert "Traceback" not in text
    assert any("SIGTERM received: stopping the node" in line for line in after), text
    assert any("node stopped" in line for line in after), text


def test_the_listen_address_is_printed_once_at_start(tmp_path: Path) -> None:
    proc, lines, ready = start_node(tmp_path)
    try:
        assert ready.wait(120), "\n".join(lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    listening = [line for line in lines if "listening on" in line]
    assert len(listening) == 1, "\n".join(lines)
