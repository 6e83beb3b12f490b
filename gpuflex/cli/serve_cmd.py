"""``gpuflex serve``: serve a finished job's model (or a local Hugging Face directory) from the
running node, behind its OpenAI-compatible API and to every node of the mesh."""

from __future__ import annotations

import re

import typer

from gpuflex.cli.common import HomeOpt, JsonOpt, call_node, emit_json, fail, text

_JOB_RE = re.compile(r"^[0-9a-f]{16}$")


def serve(source: str = typer.Argument(..., help="A finished job's id, or a local Hugging Face model directory."),
          name: str = typer.Option("", "--name", help="The model name clients ask for (default: the job id "
                                                      "or the directory's name)."),
          home: str | None = HomeOpt, json_out: bool = JsonOpt) -> None:
    """Load a model on the running node and announce it to the mesh.

    A job's model is checked against the ledger's model hash; a LoRA adapter runs on the base
    the job pinned. Put it under [serve.models] in node.toml to serve it at every start.
    """
    from pathlib import Path

    is_job = bool(_JOB_RE.match(source))
    params = {"name": name or (source if is_job else Path(source).name)}
    if is_job:
        params["job"] = source
    else:
        path = Path(source).expanduser()
        if not path.is_dir():
            fail(f"{source}: neither a job id (16 hex digits) nor a model directory")
        params["path"] = str(path.resolve())
    row = call_node("serve_add", params, home=home, timeout=600)
    st = call_node("status", home=home)
    if json_out:
        emit_json({**row, "http": st["serve"]["http"]})
        return
    typer.echo(f"serving {text(row['name'])} ({text(row['source'])}, hash {text(row['hash'][:16])}…)")
    url = st["serve"]["http"]
    if url:
        typer.echo(f"OpenAI-compatible API: {url}/v1  (e.g. curl {url}/v1/completions -H 'content-type: "
                   f"application/json' -d '{{\"model\": \"{text(row['name'])}\", \"prompt\": \"Hello\"}}')")
    else:
        typer.echo("this node has no HTTP API; set [serve] http = \"127.0.0.1:8000\" in node.toml to add one")
