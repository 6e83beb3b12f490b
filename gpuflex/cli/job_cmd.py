"""``gpuflex job init|submit|status|results``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from gpuflex.cli.common import JsonOpt, call_node, emit_json, fail, short

job_app = typer.Typer(help="Create, submit and follow training jobs.", no_args_is_help=True)
NodeOpt = typer.Option(None, "--node", "--home", help="Home of the node to talk to.")


@job_app.command("init")
def init(path: Path = typer.Argument(Path("job.toml"), help="Where to write the example ('-' for stdout)."),
         force: bool = typer.Option(False, help="Overwrite an existing file."),
         template: str = typer.Option("job", "--template", help="'job' (the digits demo) or 'lora' "
                                      "(LoRA fine-tuning of a language model).")) -> None:
    """Write a commented example job file (the digits demo job, or --template lora)."""
    from gpuflex.jobspec import example_job_toml

    try:
        text = example_job_toml(template)
    except ValueError as exc:
        fail(str(exc))
    if str(path) == "-":
        typer.echo(text, nl=False)
        return
    if path.exists() and not force:
        fail(f"{path} exists (use --force to overwrite)")
    path.write_text(text)
    typer.echo(f"wrote {path}")


def load_job_file(path: Path) -> dict[str, Any]:
    from gpuflex.jobspec import JobSpec, JobSpecError

    if not path.exists():
        fail(f"job file {path} does not exist")
    try:
        spec = JobSpec.from_toml(path)
    except JobSpecError as exc:
        fail(f"{path} is not a valid job:\n{exc}")
    except ValueError as exc:
        fail(f"{path}: {exc}")
    return spec.to_dict()


@job_app.command("submit")
def submit(job_file: Path = typer.Argument(..., help="The job's TOML file."), node: str | None = NodeOpt,
           json_out: bool = JsonOpt) -> None:
    """Validate the job file, then sign and publish it to the mesh; prints the job id."""
    spec = load_job_file(job_file)
    reply = call_node("job_submit", {"spec": spec}, home=node, timeout=30)
    if json_out:
        emit_json(reply)
    else:
        typer.echo(reply["job_id"])


def format_status(js: dict[str, Any]) -> str:
    lines = [
        f"job          {js['job_id']} ({js['name']})",
        f"state        {js['state']}  round {js['round']}/{js['rounds']}  phase {js['phase']}",
        f"coordinator  {js['coordinator'] or '-'}{'  (this node)' if js['is_coordinator'] else ''}",
        f"role         {js['role']}",
        *([f"privacy      ε = {js['epsilon']:.2f} spent"
           + (f" of budget {js['epsilon_budget']:g}" if js.get("epsilon_budget") else "")]
          if js.get("epsilon") is not None else []),
        f"members      {len(js['members'])}: {', '.join(short(m) for m in js['members'])}",
    ]
    if js.get("error"):
        lines.append(f"error        {js['error']}")
    if js.get("waiting"):
        lines.append(f"waiting      {js['waiting']}")
    if js.get("stalled"):
        lines.append(f"stalled      {js['stalled']}")
    if js.get("write_error"):
        lines.append(f"disk         {js['write_error']}")
    if js.get("work"):
        lines.extend(format_work(js["work"], js["round"]))
    if js["metrics"]:
        lines.append(f"{'round':>7} {'loss':>8} {'accuracy':>9} {'train loss':>11} {'nodes':>6} {'time':>7}")
        for m in js["metrics"]:
            lines.append(f"{m['round']:>7} {m['loss'] or 0:>8.4f} {m['accuracy'] or 0:>9.4f} "
                         f"{m['train_loss'] or 0:>11.4f} {m['contributors'] or 0:>6} {m['duration_s'] or 0:>6.1f}s")
    return "\n".join(lines)


def format_work(rows: list[dict[str, Any]], round_: int) -> list[str]:
    """Round ``round_``'s work per member: its device, local steps, samples per second and
    share of the round's compute (each member's training seconds over everyone's)."""
    def num(row: dict[str, Any], key: str, fmt: str) -> str:
        value = row.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) else "-"

    lines = [f"work         round {round_}",
             f"  {'member':<10} {'device':<28} {'samples':>8} {'steps':>6} {'samples/s':>10} {'train s':>8} {'share':>6}"]
    for row in rows:
        share = row.get("compute_share")
        lines.append(f"  {short(str(row.get('peer', '?'))):<10} {str(row.get('device') or '-')[:28]:<28} "
                     f"{num(row, 'samples', 'd'):>8} {num(row, 'steps', 'd'):>6} {num(row, 'samples_per_s', '.1f'):>10} "
                     f"{num(row, 'compute_s', '.2f'):>8} "
                     f"{format(share, '.0%') if isinstance(share, (int, float)) else '-':>6}")
    return lines


@job_app.command("status")
def status(job: str | None = typer.Argument(None, help="Job id or prefix (default: the newest)."),
           node: str | None = NodeOpt, json_out: bool = JsonOpt,
           watch: bool = typer.Option(False, help="Refresh every second until the job ends.")) -> None:
    """Round, phase, coordinator, members, each member's work in the last round (device, local
    steps, samples per second, share of the compute), and loss and accuracy so far."""
    while True:
        js = call_node("job_status", {"job": job} if job else {}, home=node)
        if json_out:
            emit_json(js)
        else:
            typer.echo(format_status(js))
        if not watch or js["state"] in ("done", "failed"):
            return
        time.sleep(1.0)
        typer.echo("")


@job_app.command("results")
def results(job: str = typer.Argument(..., help="Job id or prefix."),
            out: Path = typer.Option(..., "--out", help="Directory to write into."),
            node: str | None = NodeOpt, json_out: bool = JsonOpt,
            mlflow: str | None = typer.Option(None, "--mlflow", metavar="URI",
                                              help="Also log the job to MLflow (pip install 'gpuflex[mlflow]').")
            ) -> None:
    """Write the final model (a torch state_dict; for a language model a Hugging Face model or
    LoRA adapter directory in safetensors, with its tokenizer), metrics, a plot and the ledger."""
    reply = call_node("job_results", {"job": job, "out": str(out.resolve())}, home=node, timeout=120)
    if mlflow:
        from gpuflex.tracking import TrackingError, export_mlflow

        try:
            reply["mlflow_run_id"] = export_mlflow(out, mlflow)
        except TrackingError as exc:
            fail(str(exc))
    if json_out:
        emit_json(reply)
    else:
        for f in reply["files"]:
            typer.echo(f)


