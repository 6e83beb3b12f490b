"""Batch inference (a job of ``kind = "inference"``): one model, many prompts, every answer
signed by the node that made it, written as it arrives, resumable after a kill.

The prompts are carried in the job (at most ``MAX_PROMPTS``, ``MAX_PROMPT_BYTES`` in all) or
read from a data set the operator maps in ``[data]`` (one prompt per line). The node the job
is submitted to runs it: it sends the prompts through its router, so they spread over every
node serving the model by load (``concurrency`` at once), and appends each answer, with the
server's signed record of it, to ``<home>/inference/<id>/outputs.jsonl`` (flushed to disk line
by line). A run killed midway starts again with the node and skips what it already holds; a
line cut short by the kill is dropped. Greedy decoding (the default) makes the outputs the
same whichever node answered.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import blake3
import trio

from gpuflex.serve import BadRequest, ServeError
from gpuflex.serve.request import GenRequest, parse_request
from gpuflex.serve.wire import SERVE_OUTPUT
from mesh.codec import WireError, open_envelope
from mesh.fsutil import atomic_write_text

log = logging.getLogger("gpuflex.serve")
MAX_PROMPTS = 10_000
MAX_PROMPT_BYTES = 4 << 20
RUNS_DIR = "inference"
OUTPUTS = "outputs.jsonl"
MAX_TRIES = 3


@dataclass(frozen=True)
class InferenceSpec:
    name: str
    model: str
    prompts: tuple[str, ...]
    max_tokens: int = 64
    temperature: float = 0.0
    seed: int | None = None
    concurrency: int = 8

    @property
    def run_id(self) -> str:
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return str(blake3.blake3(canonical.encode()).hexdigest()[:16])

    def request(self, index: int) -> GenRequest:
        seed = None if self.seed is None else self.seed + index
        return GenRequest(self.model, self.prompts[index], self.max_tokens, self.temperature, seed=seed)


def parse_inference_spec(raw: Any, data_path: Callable[[str], Path | None]) -> InferenceSpec:
    """Validate a job file of ``kind = "inference"``; BadRequest names the field."""
    if not isinstance(raw, dict) or raw.get("kind") != "inference":
        raise BadRequest("an inference job needs kind = \"inference\"")
    name = raw.get("name", "inference")
    if not isinstance(name, str) or not 0 < len(name) <= 64:
        raise BadRequest("'name' must be a string of 1 to 64 characters")
    prompts, data = raw.get("prompts"), raw.get("data")
    if (prompts is None) == (data is None):
        raise BadRequest("give either 'prompts' (a list) or 'data' (a data set named in [data])")
    if data is not None:
        path = data_path(str(data))
        if path is None:
            raise BadRequest(f"no [data] entry {str(data)[:64]!r} on this node")
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_PROMPT_BYTES + 1)
        if len(text) > MAX_PROMPT_BYTES:
            raise BadRequest(f"data set {data!r} is over {MAX_PROMPT_BYTES} bytes")
        prompts = [line for line in text.splitlines() if line.strip()]
    if not isinstance(prompts, list) or not 0 < len(prompts) <= MAX_PROMPTS \
            or not all(isinstance(p, str) for p in prompts) or sum(len(p) for p in prompts) > MAX_PROMPT_BYTES:
        raise BadRequest(f"'prompts' must be 1 to {MAX_PROMPTS} strings, {MAX_PROMPT_BYTES} characters in all")
    first = parse_request({"model": raw.get("model"), "prompt": prompts[0], "max_tokens": raw.get("max_tokens", 64),
                           "temperature": raw.get("temperature", 0.0), "seed": raw.get("seed")})
    concurrency = raw.get("concurrency", 8)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or not 1 <= concurrency <= 256:
        raise BadRequest("'concurrency' must be an integer from 1 to 256")
    return InferenceSpec(name, first.model, tuple(prompts), first.max_tokens, first.temperature, first.seed,
                         concurrency)


def request_digest(req: GenRequest) -> str:
    return str(blake3.blake3(json.dumps(req.to_wire(), sort_keys=True).encode()).hexdigest())


def verify_output(frame: bytes, server: str, req: GenRequest, text: str) -> dict[str, Any]:
    """The server's signed record of its answer, checked: its signer, request and text."""
    try:
        env = open_envelope(frame, expect_kind=SERVE_OUTPUT)
    except WireError as exc:
        raise ServeError(f"the server's signature does not verify: {exc}", 502) from None
    body = env.body if isinstance(env.body, dict) else {}
    if env.sender != server or body.get("request") != request_digest(req) or body.get("text") != text:
        raise ServeError("the server's signed record does not match its answer", 502)
    return body


class BatchRun:
    def __init__(self, home: Path, spec: InferenceSpec) -> None:
        self.spec = spec
        self.dir = home / RUNS_DIR / spec.run_id
        self.done: dict[int, dict[str, Any]] = {}
        self.error = ""
        self.finished = trio.Event()

    def save_spec(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / "spec.json").exists():
            atomic_write_text(self.dir / "spec.json", json.dumps(asdict(self.spec)), mode=0o600)

    def load_done(self) -> None:
        """What an earlier (perhaps killed) run already wrote; a torn last line is dropped."""
        path = self.dir / OUTPUTS
        if not path.exists():
            return
        good = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                index = int(row["index"])
            except (ValueError, KeyError, TypeError):
                continue
            if 0 <= index < len(self.spec.prompts):
                self.done[index] = row
                good.append(line)
        atomic_write_text(path, "".join(g + "\n" for g in good), mode=0o600)

    def _append(self, row: dict[str, Any]) -> None:
        with open(self.dir / OUTPUTS, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    async def run(self, ask: Callable[[GenRequest], Any]) -> None:
        """Answer every prompt not answered yet; ``ask`` returns (server, text, signed frame)."""
        await trio.to_thread.run_sync(self.save_spec)
        await trio.to_thread.run_sync(self.load_done)
        todo = [i for i in range(len(self.spec.prompts)) if i not in self.done]
        limit = trio.CapacityLimiter(self.spec.concurrency)

        async def one(index: int) -> None:
            async with limit:
                req = self.spec.request(index)
                for attempt in range(MAX_TRIES):
                    try:
                        server, text, frame = await ask(req)
                        verify_output(frame, server, req, text)
                        break
                    except ServeError as exc:
                        if attempt == MAX_TRIES - 1:
                            self.error = f"prompt {index}: {exc}"
                            raise
                row = {"index": index, "prompt": req.prompt, "text": text, "server": server,
                       "signed": base64.b64encode(frame).decode()}
                await trio.to_thread.run_sync(self._append, row)
                self.done[index] = row

        try:
            async with trio.open_nursery() as nursery:
                for index in todo:
                    nursery.start_soon(one, index)
        except ServeError as exc:
            log.error("inference run %s stopped: %s", self.spec.run_id, exc)
        finally:
            self.finished.set()

    def status(self) -> dict[str, Any]:
        return {"run_id": self.spec.run_id, "name": self.spec.name, "kind": "inference", "model": self.spec.model,
                "done": len(self.done), "total": len(self.spec.prompts),
                "state": "failed" if self.error else ("done" if len(self.done) == len(self.spec.prompts)
                                                      else "running"), "error": self.error}

    def spec_table(self) -> dict[str, Any]:
        """The job's settings as its file gives them (the prompts counted, not listed)."""
        table = asdict(self.spec)
        table["prompts"] = len(self.spec.prompts)
        return table

    def job_row(self) -> dict[str, Any]:
        """The run as the node's job list shows it (``jobs``, ``job_status``): the fields a
        training job's summary has, answers for rounds, and which servers answered how many."""
        st = self.status()
        servers = Counter(str(row.get("server", "")) for row in self.done.values())
        phase = {"running": "infer"}.get(st["state"], st["state"])
        return {**st, "job_id": st["run_id"], "round": st["done"], "rounds": st["total"], "phase": phase,
                "phase_progress": st["done"] / max(1, st["total"]), "role": "collector", "coordinator": "",
                "is_coordinator": False, "members": sorted(servers), "servers": dict(servers), "metrics": [],
                "max_tokens": self.spec.max_tokens, "temperature": self.spec.temperature}

    def write_results(self, out: Path) -> Path:
        """The outputs in prompt order as JSONL (``gpuflex job results``)."""
        target = out if out.suffix == ".jsonl" else out / f"{self.spec.run_id}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        rows = [self.done[i] for i in sorted(self.done)]
        atomic_write_text(target, "".join(json.dumps(r) + "\n" for r in rows), mode=0o644)
        return target
