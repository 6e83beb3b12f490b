"""`gpuflex web` as a user meets it when something is wrong: one line, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

from typer.testing import CliRunner

from gpuflex.cli.main import app


def web(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["web", *args])
    return result.exit_code, result.output


def test_listen_must_be_an_ip_address(tmp_path: Path) -> None:
    code, out = web("--home", str(tmp_path), "--listen", "gpu-box")
    assert code == 1 and "Traceback" not in out
    assert out.strip() == "error: --listen 'gpu-box' is not an IP address (try 127.0.0.1 or 0.0.0.0)"


def test_a_busy_port_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out = web("--home", str(tmp_path), "--port", str(port))
    assert code == 1 and "Traceback" not in out
    assert out.strip() == f"error: port {port} on 127.0.0.1 is already in use: pick another with --port"


def test_off_loopback_a_login_token_is_made_private_first(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: binding fails before anything listens.
    code, out = web("--home", str(tmp_path), "--listen", "192.0.2.1", "--port", "0")
    assert code == 1 and out.strip() == "error: 192.0.2.1 is not an address of this machine"
    token = tmp_path / "web.token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) == 64
