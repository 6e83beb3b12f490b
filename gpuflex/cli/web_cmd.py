"""``gpuflex web``: the web portal for a running node (overview, peers, jobs, credit, join)."""

from __future__ import annotations

import typer

from gpuflex.cli.common import HomeOpt, fail


def web(home: str | None = HomeOpt,
        port: int = typer.Option(8470, "--port", min=0, max=65535,
                                 help="Port to serve on; 0 picks a free one."),
        listen: str = typer.Option("127.0.0.1", "--listen",
                                   help="Address to serve on. Anything but loopback requires the "
                                        "login token in <home>/web.token.")) -> None:
    """Serve the web portal of a node: watch the mesh, audit jobs, credit peers, invite others."""
    from gpuflex_web import WebError
    from gpuflex_web.cli import run_web

    try:
        raise typer.Exit(run_web(home, listen, port, echo=typer.echo))
    except WebError as exc:
        fail(str(exc))
