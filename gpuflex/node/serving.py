"""The node's side of serving (``gpuflex.serve``): its settings from ``[serve]``, the finished
jobs it may serve, and the control-API methods ``serve_add`` and ``serve_status``.

``gpuflex.serve`` never imports the node: this module hands it the one thing it needs of the
jobs, exporting a finished job's model (the ledger's hash, the bytes that hash names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from gpuflex.node.control import ApiError
from gpuflex.node.export import export_results
from gpuflex.node.jobs import JobManager
from gpuflex.node.kinds import JobState
from gpuflex.nodeconfig import NodeConfig
from gpuflex.serve import ServeError
from gpuflex.serve.batchrun import parse_inference_spec
from gpuflex.serve.request import parse_request
from gpuflex.serve.service import ServeService
from gpuflex.serve.settings import ServeSettings, model_entry, parse_serve
from mesh.node import MeshNode

PLAYGROUND_PROMPT_CHARS = 8192
PLAYGROUND_MAX_TOKENS = 512
PLAYGROUND_DEADLINE_S = 120.0


def serve_settings(config: NodeConfig, home: Path) -> ServeSettings:
    """``[serve]`` validated; ServeError names the key."""
    return parse_serve(config.serve, home)


class NodeServing:
    def __init__(self, mesh: MeshNode, jobs: JobManager, home: Path, settings: ServeSettings,
                 config: NodeConfig) -> None:
        self.jobs, self.home, self.config = jobs, home, config
        self.service = ServeService(mesh, home, settings, self.export_job)

    async def export_job(self, job_id: str, out: Path) -> str:
        """Export finished job ``job_id``'s model into ``out``; the ledger's model hash."""
        driver = self.jobs.drivers.get(job_id)
        if driver is None:
            raise ServeError(f"job {job_id} is not on this node (serve a job this node took part in)", 404)
        if driver.state is not JobState.DONE:
            raise ServeError(f"job {job_id} is {driver.state}, not done; serve it once it has finished", 400)
        export = driver.export()
        if not export.model_hash:
            raise ServeError(f"job {job_id} committed no model", 400)
        try:
            await trio.to_thread.run_sync(export_results, export, out)
            written = json.loads((out / "job.json").read_text())
        except (OSError, ValueError) as exc:
            raise ServeError(f"could not export job {job_id} to {out}: {exc}") from None
        # The job's final_model picks the last or the best-scored round's model: both are
        # committed in the ledger, and the exported blob must hash to the one picked.
        return str(written["best"]["model_hash"]) if written.get("model_pt") == "best" else export.model_hash

    async def api_add(self, params: dict[str, Any]) -> dict[str, Any]:
        name, source = params.get("name"), params.get("job") or params.get("path")
        if not isinstance(name, str) or not isinstance(source, str):
            raise ApiError("serve_add needs a 'name' and a 'job' id or a local 'path'")
        try:
            entry = model_entry(name, {"job": source} if "job" in params else {"path": source}, self.home, "serve")
            return await self.service.add(entry)
        except ServeError as exc:
            raise ApiError(str(exc)) from None

    async def api_status(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.service.status()

    async def api_complete(self, params: dict[str, Any]) -> dict[str, Any]:
        """One prompt through the router, answered whole: the portal's playground. Bounded more
        tightly than the HTTP API (a page's prompt, a page's answer, a deadline)."""
        prompt = params.get("prompt")
        if isinstance(prompt, str) and len(prompt) > PLAYGROUND_PROMPT_CHARS:
            raise ApiError(f"the prompt has {len(prompt)} characters; the playground takes {PLAYGROUND_PROMPT_CHARS}")
        try:
            req = parse_request({k: params.get(k) for k in ("model", "prompt", "max_tokens", "temperature", "stop")},
                                default_max_tokens=64)
            if req.max_tokens > PLAYGROUND_MAX_TOKENS:
                raise ServeError(f"'max_tokens' is at most {PLAYGROUND_MAX_TOKENS} here")
            with trio.fail_after(PLAYGROUND_DEADLINE_S):
                return await self.service.complete(req)
        except ServeError as exc:
            raise ApiError(str(exc)) from None
        except trio.TooSlowError:
            raise ApiError(f"no answer within {PLAYGROUND_DEADLINE_S:.0f} s") from None

    async def api_jobs(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """``jobs``: the training jobs, then this node's batch inference jobs (``kind``
        ``inference``), so ``gpuflex job list``, the dashboard and the portal list both."""
        return [*await self.jobs.api_jobs(params), *self._run_rows()]

    def _run_rows(self) -> list[dict[str, Any]]:
        return [r.job_row() for r in reversed(list(self.service.runs.values()))]

    async def api_job_status(self, params: dict[str, Any]) -> dict[str, Any]:
        """``job_status``: an inference job's summary when the id names one, else a training
        job's (the newest training job when none is named, as before)."""
        key = str(params.get("job") or "")
        if key and not any(j.startswith(key) or d.spec.name == key for j, d in self.jobs.drivers.items()):
            try:
                run = self.service.run_of(key)
            except ServeError:
                pass  # the job manager says there is no such job, in its words
            else:
                return {**run.job_row(), "spec": {"kind": "inference", **run.spec_table()}}
        return await self.jobs.api_job_status(params)

    async def api_ledger(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """``ledger``: a training job's committed rounds; a batch inference job has none (its
        answers' signed records are its log: ``gpuflex job results``)."""
        key = str(params.get("job") or "")
        if key and key not in self.jobs.drivers and any(r.startswith(key) for r in self.service.runs):
            return []
        return await self.jobs.api_ledger(params)

    async def api_infer_submit(self, params: dict[str, Any]) -> dict[str, Any]:
        """Start (or resume) a batch inference run; its id is the hash of its settings."""
        try:
            spec = await trio.to_thread.run_sync(parse_inference_spec, params.get("spec"), self.config.data_path)
        except (ServeError, OSError, UnicodeDecodeError) as exc:
            raise ApiError(f"not a valid inference job: {exc}") from None
        return self.service.start_run(spec)

    async def api_infer_results(self, params: dict[str, Any]) -> dict[str, Any]:
        out = params.get("out")
        if not isinstance(out, str) or not out:
            raise ApiError("results need an output path ('out')")
        try:
            run = self.service.run_of(str(params.get("job", "")))
            path = await trio.to_thread.run_sync(run.write_results, Path(out))
        except (ServeError, OSError) as exc:
            raise ApiError(str(exc)) from None
        return {"files": [str(path)], **run.status()}
