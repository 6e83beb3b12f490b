"""``gpuflex doctor``: one command that tells a contributor whether and how their machine can join."""

from __future__ import annotations

import typer

from gpuflex.cli.common import HomeOpt, JsonOpt


def doctor(home: str | None = HomeOpt, json_out: bool = JsonOpt,
           listen: str = typer.Option("/ip4/0.0.0.0/tcp/4001", "--listen",
                                      help="The address 'node start' will listen on (multiaddr, HOST:PORT or PORT).")) -> None:
    """Check Python, torch, every GPU (with a real kernel launch), disk, port and clock; exit 1 on FAIL."""
    from gpuflex.doctor import exit_code, format_finding, iter_checks, summary_line, to_json

    findings = []
    for finding in iter_checks(home, listen):
        findings.append(finding)
        if not json_out:
            typer.echo(format_finding(finding))
    typer.echo(to_json(findings) if json_out else "\n" + summary_line(findings))
    raise typer.Exit(exit_code(findings))
