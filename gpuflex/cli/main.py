"""Entry point of the ``gpuflex`` command.

Imports here stay light (typer and the standard library): torch and libp2p are imported
inside the commands that need them, so ``gpuflex peers`` and ``gpuflex status`` answer fast.
"""

from __future__ import annotations

import typer

from gpuflex.cli import audit_cmd, doctor_cmd, job_cmd, node_cmd, query, serve_cmd, web_cmd
from gpuflex.cli.common import HomeOpt

app = typer.Typer(help="GPUFlex: federated training on a peer-to-peer mesh of the GPUs people own.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.command("keygen")(node_cmd.keygen)
app.add_typer(node_cmd.node_app, name="node")
app.command("peers")(query.peers)
app.command("status")(query.status)
app.command("version")(query.version)
app.add_typer(job_cmd.job_app, name="job")
app.add_typer(audit_cmd.audit_app, name="audit")
app.command("doctor")(doctor_cmd.doctor)
app.command("web")(web_cmd.web)
app.command("serve")(serve_cmd.serve)


@app.command("demo")
def demo(nodes: int = typer.Option(4, "--nodes", min=2, max=32, help="Node processes to start."),
         rounds: int = typer.Option(15, "--rounds", min=1, help="Rounds of training."),
         tui: bool = typer.Option(False, "--tui", help="Follow the job in the dashboard."),
         workdir: str | None = typer.Option(None, help="Keep node homes and results here."),
         baseline: bool = typer.Option(True, help="Also train the same CNN centrally and compare.")) -> None:
    """Start a local mesh on loopback, train the digits CNN across it, and report."""
    from gpuflex.demo import run_demo

    raise typer.Exit(run_demo(nodes=nodes, rounds=rounds, tui=tui, workdir=workdir, baseline=baseline))


@app.command("dashboard")
def dashboard(home: str | None = HomeOpt) -> None:
    """Open the terminal dashboard on a running node."""
    from tui.app import run_dashboard

    run_dashboard(home=home)


def run() -> None:
    app()
