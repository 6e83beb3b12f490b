"""``gpuflex doctor``: one command that tells a contributor whether and how their machine can join."""

from __future__ import annotations

from itertools import chain
from pathlib import Path

import typer

from gpuflex.cli.common import HomeOpt, JsonOpt


def doctor(home: str | None = HomeOpt, json_out: bool = JsonOpt,
           listen: str | None = typer.Option(None, "--listen",
                                             help="The address 'node start' will listen on (multiaddr, HOST:PORT or "
                                                  "PORT; default: the running node's own, else "
                                                  "/ip4/0.0.0.0/tcp/4001)."),
           job: Path | None = typer.Option(None, "--job", metavar="FILE",
                                           help="Also fit this job file to every device: precision, micro-batch, "
                                                "threads and throughput, probed with real steps.")) -> None:
    """Check Python, torch, every GPU (with a real kernel launch), disk, port and clock; with
    --job, how each device would train that job. Exit 1 on FAIL."""
    from gpuflex.doctor import exit_code, format_finding, iter_checks, summary_line, to_json

    checks = iter_checks(home, listen)
    if job is not None:
        from gpuflex.doctor.fit import check_job_fit

        checks = chain(checks, check_job_fit(job, home))
    findings = []
    for finding in checks:
        findings.append(finding)
        if not json_out:
            typer.echo(format_finding(finding))
    typer.echo(to_json(findings) if json_out else "\n" + summary_line(findings))
    raise typer.Exit(exit_code(findings))
