"""``gpuflex job init|submit|status|results``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer

from gpuflex.cli.common import JsonOpt, call_node, emit_json, fail, number, short, text

job_app = typer.Typer(help="Create, submit and follow training jobs.", no_args_is_help=True,
                    rich_markup_mode=None)
NodeOpt = typer.Option(None, "--node", "--home", help="Home of the node to talk to.")


@job_app.command("init")
def init(path: Path = typer.Argument(Path("job.toml"), help="Where to write the example ('-' for stdout)."),
         force: bool = typer.Option(False, help="Overwrite an existing file."),
         template: str = typer.Option("job", "--template", help="'job' (the digits demo) or 'lora' "
                                      "(LoRA fine-tuning of a language model).")) -> None:
    """Write a commented example job file (the digits demo job, or --template lora); YAML when
    PATH ends in .yaml or .yml."""
    from gpuflex.jobspec import example_job_toml, example_job_yaml
    from gpuflex.jobyaml import YAML_SUFFIXES

    try:
        text = (example_job_yaml if path.suffix.lower() in YAML_SUFFIXES else example_job_toml)(template)
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
        spec = JobSpec.from_file(path)
    except JobSpecError as exc:
        fail(f"{path} is not a valid job:\n{exc}")
    except ValueError as exc:
        fail(f"{path}: {exc}")
    return spec.to_dict()


def inference_file(path: Path) -> dict[str, Any] | None:
    """The job file's table when it is an inference job, else None."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # load_job_file reports it
    return raw if raw.get("kind") == "inference" else None


@job_app.command("submit")
def submit(job_file: Path = typer.Argument(..., help="The job file (TOML, or YAML when it ends in .yaml or .yml)."),
           node: str | None = NodeOpt, json_out: bool = JsonOpt) -> None:
    """Validate the job file, then sign and publish it to the mesh; prints the job id.

    A file with ``kind = "inference"`` is a batch inference job: this node sends its prompts to
    the nodes serving its model and collects the signed answers (docs/serving.md)."""
    raw = inference_file(job_file)
    if raw is not None:
        reply = call_node("infer_submit", {"spec": raw}, home=node, timeout=60)
        if json_out:
            emit_json(reply)
        else:
            typer.echo(reply["run_id"])
        return
    spec = load_job_file(job_file)
    reply = call_node("job_submit", {"spec": spec}, home=node, timeout=30)
    if json_out:
        emit_json(reply)
    else:
        typer.echo(reply["job_id"])


def format_inference(js: dict[str, Any]) -> str:
    """A batch inference job's summary: answers collected, by which servers."""
    lines = [f"job          {text(js['job_id'])} ({text(js.get('name'))}), batch inference",
             f"state        {text(js.get('state'))}  "
             f"answers {number(js.get('done'), 'd')}/{number(js.get('total'), 'd')}",
             f"model        {text(js.get('model'))}  (max_tokens {number(js.get('max_tokens'), 'd')}, "
             f"temperature {number(js.get('temperature'), 'g')})"]
    servers = js.get("servers")
    servers = servers if isinstance(servers, dict) else {}
    lines += [f"server       {short(peer)}: {number(count, 'd')} answers" for peer, count in sorted(servers.items())]
    if js.get("error"):
        lines.append(f"error        {text(js['error'], 1000)}")
    return "\n".join(lines)


def format_status(js: dict[str, Any]) -> str:
    """The JobSummary for people. The name, the errors and every figure may be a peer's, so
    text goes through ``text`` and numbers through ``number``."""
    lines = [
        f"job          {text(js['job_id'])} ({text(js['name'])})",
        f"state        {text(js['state'])}  round {number(js['round'], 'd')}/{number(js['rounds'], 'd')}  "
        f"phase {text(js['phase'])}",
        f"coordinator  {text(js['coordinator'] or '-')}{'  (this node)' if js['is_coordinator'] else ''}",
        f"role         {text(js['role'])}",
        *([f"privacy      ε = {number(js['epsilon'], '.2f')} spent"
           + (f" of budget {number(js['epsilon_budget'], 'g')}" if js.get("epsilon_budget") else "")]
          if js.get("epsilon") is not None else []),
        f"members      {len(js['members'])}: {', '.join(short(m) for m in js['members'])}",
    ]
    for key, label in (("error", "error"), ("waiting", "waiting"), ("stalled", "stalled"), ("write_error", "disk")):
        if js.get(key):
            lines.append(f"{label:<12} {text(js[key], 1000)}")
    gone = js.get("gone")
    for row in gone if isinstance(gone, list) else []:
        if isinstance(row, dict):
            why = text(row.get("reason"), 300)
            lines.append(f"gone         {short(str(row.get('peer', '')))}: the job failed there ({why})")
    if js.get("work"):
        lines.extend(format_work(js["work"], js["round"]))
    if js["metrics"]:
        # A language model's rounds have a perplexity: a column of its own when they do.
        ppl = any(isinstance(m.get("perplexity"), (int, float)) for m in js["metrics"])
        lines.append(f"{'round':>7} {'loss':>8} {'accuracy':>9}{' perplexity' if ppl else ''} {'train loss':>11} "
                     f"{'nodes':>6} {'time':>7} {'up MB':>9} {'down MB':>8}")
        for m in js["metrics"]:
            lines.append(f"{number(m['round'], '>7')} {number(m['loss'], '>8.4f')} {number(m['accuracy'], '>9.4f')}"
                         f"{' ' + number(m.get('perplexity'), '>10.2f') if ppl else ''} "
                         f"{number(m['train_loss'], '>11.4f')} {number(m['contributors'], '>6')} "
                         f"{number(m['duration_s'], '>6.1f')}s {number(_mb(m.get('update_bytes')), '>9.3f')} "
                         f"{number(_mb(m.get('down_bytes')), '>8.3f')}")
        ups = [m.get("update_bytes") for m in js["metrics"]]
        downs = [(m.get("down_bytes"), m.get("contributors")) for m in js["metrics"]]
        if all(isinstance(u, (int, float)) for u in ups) and all(
                isinstance(d, (int, float)) and isinstance(c, (int, float)) for d, c in downs):
            lines.append(f"bytes        {number(_mb(sum(ups)), '.3f')} MB of updates up, "
                         f"{number(_mb(sum(d * c for d, c in downs)), '.3f')} MB down "
                         "to the contributors (up MB: all members' updates; down MB: what each member "
                         "downloads, the step or the model)")
    return "\n".join(lines)


def _mb(value: object) -> float | None:
    return value / 1e6 if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def format_work(rows: list[dict[str, Any]], round_: int) -> list[str]:
    """Round ``round_``'s work per member: its device, local steps, samples per second and
    share of the round's compute (each member's training seconds over everyone's)."""
    lines = [f"work         round {round_}",
             f"  {'member':<11} {'device':<28} {'samples':>8} {'steps':>6} {'samples/s':>10} {'train s':>8} "
             f"{'share':>6} "
             f"{'sent MB':>8}"]
    for row in rows:
        share = row.get("compute_share")
        lines.append(f"  {short(text(row.get('peer', '?'), 80)):<11} {text(row.get('device') or '-', 28):<28} "
                     f"{number(row.get('samples'), '>8')} {number(row.get('steps'), '>6')} "
                     f"{number(row.get('samples_per_s'), '>10.1f')} {number(row.get('compute_s'), '>8.2f')} "
                     f"{number(share, '>6.0%')} {number(_mb(row.get('update_bytes')), '>8.3f')}")
    return lines


def format_spec(js: dict[str, Any]) -> str:
    """The job's spec, one ``key = value`` line each. It is a stranger's text (the publisher's),
    so every value goes through ``text``; a node too old to send it says so."""
    spec = js.get("spec")
    if not isinstance(spec, dict):
        return "spec         (this node does not report it)"
    lines = [f"spec         from {short(js.get('publisher'))}"]
    lines += [f"  {text(key, 40):<20} = {text(json.dumps(value, ensure_ascii=False), 500)}"
              for key, value in sorted(spec.items())]
    return "\n".join(lines)


def format_rows(jobs: list[dict[str, Any]]) -> list[str]:
    """``gpuflex job list``'s table, a header and one line per job, each column as wide as
    its widest cell (a peer's job name is clipped, control characters escaped)."""
    header = ("JOB", "STATE", "ROUND", "PHASE", "NAME")
    rows = [(text(js.get("job_id"), 16), text(js.get("state"), 8),
             f"{number(js.get('round'), 'd')}/{number(js.get('rounds'), 'd')}", text(js.get("phase"), 8),
             text(js.get("name"), 60)) for js in jobs]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    right = {2}  # rounds line up on their slash-free right edge

    def line(cells: tuple[str, ...]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        out[-1] = cells[-1]  # no padding after the last column
        return "  ".join(out)

    return [line(header), *(line(r) for r in rows)]


@job_app.command("list")
def list_jobs(node: str | None = NodeOpt, json_out: bool = JsonOpt) -> None:
    """The jobs this node runs, newest first: id, state, round, phase and name."""
    jobs = call_node("jobs", home=node)
    if json_out:
        emit_json(jobs)
        return
    if not jobs:
        typer.echo("no jobs yet")
        return
    for row in format_rows(jobs):
        typer.echo(row)


@job_app.command("status")
def status(job: str | None = typer.Argument(None, help="Job id or prefix (default: the newest)."),
           node: str | None = NodeOpt, json_out: bool = JsonOpt,
           watch: bool = typer.Option(False, help="Refresh every second until the job ends."),
           spec: bool = typer.Option(False, "--spec", help="Also print the job's spec, as this node validated it.")
           ) -> None:
    """Round, phase, coordinator, members, each member's work in the last round (device, local
    steps, samples per second, share of the compute), and loss and accuracy so far (``--json``
    includes the job's spec and publisher)."""
    show = Snapshots(sys.stdout.isatty()) if watch and not json_out else None
    while True:
        js = call_node("job_status", {"job": job} if job else {}, home=node)
        if json_out:
            emit_json(js)
        else:
            if js.get("kind") == "inference":
                view = format_inference(js) + ("\n" + format_spec(js) if spec else "")
            else:
                view = format_status(js) + ("\n" + format_spec(js) if spec else "")
            typer.echo(show.next(view) if show is not None else view, nl=show is None)
        if not watch or js["state"] in ("done", "failed"):
            return
        time.sleep(1.0)
        if json_out:
            typer.echo("")


class Snapshots:
    """``job status --watch`` output: on a terminal each refresh redraws the screen in place;
    otherwise (a pipe, a log file) the first snapshot is printed whole and then only its lines
    that changed, so a 400-round job's log grows by a line a round, not a snapshot a second."""

    CLEAR = "\x1b[H\x1b[2J"

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.shown: list[str] = []

    def next(self, view: str) -> str:
        lines = view.splitlines()
        if self.tty:
            out = self.CLEAR + view + "\n"
        else:
            seen = set(self.shown)
            out = "".join(line + "\n" for line in lines if line not in seen)
        self.shown = lines
        return out


@job_app.command("results")
def results(job: str = typer.Argument(..., help="Job id or prefix."),
            out: Path = typer.Option(..., "--out", help="Directory to write into."),
            node: str | None = NodeOpt, json_out: bool = JsonOpt,
            mlflow: str | None = typer.Option(None, "--mlflow", metavar="URI",
                                              help="Also log the job to MLflow (pip install 'gpuflex[mlflow]').")
            ) -> None:
    """Write the final model (a torch state_dict; for a language model a Hugging Face model or
    LoRA adapter directory in safetensors, with its tokenizer), metrics, a plot and the ledger;
    for a batch inference job, its signed answers as JSONL (into --out, or --out FILE.jsonl)."""
    runs = call_node("serve_status", home=node).get("runs", [])
    if any(r["run_id"].startswith(job) for r in runs):  # a batch inference job: its answers as JSONL
        reply = call_node("infer_results", {"job": job, "out": str(out.resolve())}, home=node, timeout=120)
    else:
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


