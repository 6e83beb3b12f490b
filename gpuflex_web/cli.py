"""``gpuflex web``: start the portal for one node's home and serve until Ctrl-C."""

from __future__ import annotations

import errno
import ipaddress
import signal
import sys
from collections.abc import Callable

import trio

from gpuflex import __version__
from gpuflex.home import CONTROL_FILE, resolve_home
from gpuflex_web import WebError
from gpuflex_web.security import TOKEN_FILE, is_loopback, load_or_create_token

DEFAULT_PORT = 8470


def check_listen(listen: str) -> str:
    """An IP address or ``localhost``; a host name could resolve to anything, so it is refused."""
    if listen == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(listen.strip("[]")))
    except ValueError:
        raise WebError(f"--listen {listen!r} is not an IP address (try 127.0.0.1 or 0.0.0.0)") from None


def run_web(home: str | None, listen: str, port: int,
            echo: Callable[[str], None] = print) -> int:
    """Serve until interrupted; returns the exit code. Errors are one line, never a trace."""
    from gpuflex_web.app import Portal
    from gpuflex_web.server import serve
    from gpuflex_web.source import ControlSource
    from gpuflex_web.wheel import wheel_dirs

    root = resolve_home(home)
    host = check_listen(listen)
    token = None if is_loopback(host) else load_or_create_token(root)
    portal = Portal(ControlSource.for_home(root, label=f"the node of {root}"), token=token,
                    version=__version__, wheel_dirs=wheel_dirs(root))

    serving = False

    async def main() -> None:
        nonlocal serving
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve, portal, host, port)
            serving = True
            echo(f"GPUFlex web portal on {url}/ for the node of {root} (Ctrl-C stops it)")
            if token is not None:
                echo(f"login token: run `cat {root / TOKEN_FILE}` on this machine")
            if not (root / CONTROL_FILE).exists():
                echo(f"no node is running for {root} yet: the portal shows it once `gpuflex node start` is up")
            sys.stdout.flush()
            # A service manager stops with SIGTERM: shut down as cleanly as on Ctrl-C, so the
            # private download cache is removed.
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(main)
    except BaseException as exc:  # trio wraps errors from the nursery in exception groups
        if _leaf(exc, KeyboardInterrupt):
            return 0
        os_error = _leaf(exc, OSError)
        if serving or not isinstance(os_error, OSError):
            raise  # only a failure to bind is the user's to fix
        raise _bind_error(os_error, host, port) from None
    return 0


def _leaf(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of ``kind`` in ``exc`` or the groups nested in it."""
    if isinstance(exc, kind):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _leaf(inner, kind)
        if found is not None:
            return found
    return None


def _bind_error(exc: OSError, host: str, port: int) -> WebError:
    if exc.errno == errno.EADDRINUSE:
        return WebError(f"port {port} on {host} is already in use: pick another with --port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return WebError(f"{host} is not an address of this machine")
    return WebError(f"cannot serve on {host}:{port}: {exc.strerror or exc}")


