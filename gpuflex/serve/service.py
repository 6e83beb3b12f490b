"""A node's serving side: its own models and their batches, the mesh verbs that let peers
use them, the announcements that let peers find them, and the router every request goes
through (from the HTTP API or from a peer)."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from gpuflex.adversary import serve_tamper
from gpuflex.serve import BadRequest, ServeError, UnknownModel
from gpuflex.serve.batchrun import RUNS_DIR, BatchRun, InferenceSpec, request_digest
from gpuflex.serve.check import Answer, Checker
from gpuflex.serve.directory import Directory, parse_announcement, parse_batches, parse_stats
from gpuflex.serve.loader import LoadedModel, describe, load_directory, load_exported
from gpuflex.serve.request import GenRequest, parse_request
from gpuflex.serve.router import ITEM_S, OPEN_S, Router
from gpuflex.serve.settings import ModelEntry, ServeSettings, SourceKind
from gpuflex.serve.stats import ServeStats, node_row
from gpuflex.serve.wire import INFER, SERVE_LOAD, SERVE_OUTPUT
from mesh.codec import seal
from mesh.messaging import Inbound, Rejected
from mesh.node import MeshNode
from mesh.streaming import Send

if TYPE_CHECKING:
    from gpuflex.serve.engine import Tamper
    from gpuflex.serve.fit import ServeFit
    from gpuflex.serve.scheduler import Scheduler

log = logging.getLogger("gpuflex.serve")
ANNOUNCE_EVERY_S = 1.0
#: A job's result is exported here before it is loaded (``<home>/serve/<job id>/``).
SERVE_DIR = "serve"

#: Exports a finished job's results into a directory; returns the ledger's model hash.
ExportJob = Callable[[str, Path], Awaitable[str]]


@dataclass
class Served:
    loaded: LoadedModel
    scheduler: Scheduler
    stats: ServeStats
    fit: ServeFit

    def row(self) -> dict[str, Any]:
        """The model's status row: what it is, how busy, and how it is fitted to the device."""
        return {"name": self.loaded.name, "hash": self.loaded.model_hash, "source": self.loaded.source,
                "load": self.scheduler.load, "capacity": self.scheduler.max_batch, "fit": self.fit.row(),
                **self.stats.row()}


class ServeService:
    def __init__(self, mesh: MeshNode, home: Path, settings: ServeSettings, export_job: ExportJob) -> None:
        self.mesh, self.home, self.settings, self.export_job = mesh, home, settings, export_job
        self.served: dict[str, Served] = {}
        self.failed: dict[str, str] = {}  # model name -> why it could not be loaded
        self.directory = Directory(mesh.peer_id)
        self.router = Router(mesh.peer_id, self.directory, self.generate_local, self)
        self.routed = ServeStats()  # requests this node took in (HTTP), wherever they ran
        self.served_tokens: Counter[str] = Counter()  # server -> tokens it made for this node's callers
        self.checker = Checker(self.router.generate, self.penalise)
        self.http_url: str | None = None
        self.runs: dict[str, BatchRun] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.mesh.stream_handlers.register(INFER, self._serve_peer)
        self.mesh.handlers.register(SERVE_LOAD, self._on_load)
        self.mesh.direct_only.add(SERVE_LOAD)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._announce_loop)
            if self.settings.http:
                from gpuflex.serve.http import serve_http

                host, port = self.settings.http_address()
                try:
                    self.http_url = await nursery.start(serve_http, self, host, port)
                    log.info("OpenAI-compatible API on %s/v1", self.http_url)
                except OSError as exc:  # the port is taken: the node trains and routes without its API
                    log.error("cannot serve the API on %s: %s; set [serve] http to a free address",
                              self.settings.http, exc.strerror or exc)
            task_status.started()
            nursery.start_soon(self._resume_runs)
            for entry in self.settings.models:
                try:
                    await self.add(entry)
                except ServeError as exc:
                    log.error("not serving %s: %s", entry.name, exc)

    # -- models ----------------------------------------------------------------------------------

    async def add(self, entry: ModelEntry) -> dict[str, Any]:
        """Load ``entry`` and start serving it (replacing a model of the same name)."""
        if entry.name not in self.served and len(self.served) >= 8:
            raise ServeError("this node serves 8 models already", 400)
        from gpuflex.serve.fit import fit_model  # torch: only once a model is served
        from gpuflex.serve.scheduler import Scheduler

        s = self.settings
        claimed = sum(v.fit.memory_bytes for n, v in self.served.items() if n != entry.name)
        try:
            tamper = self._tamper()
            if entry.kind is SourceKind.JOB:
                out = self.home / SERVE_DIR / entry.job
                model_hash = await self.export_job(entry.job, out)
                loaded = await trio.to_thread.run_sync(load_exported, entry.name, out, model_hash)
            else:
                assert entry.path is not None
                loaded = await trio.to_thread.run_sync(load_directory, entry.name, entry.path, str(entry.path))
            loaded.model, fit = await trio.to_thread.run_sync(lambda: fit_model(
                loaded.model, loaded.eos_id, max_batch=s.max_batch, memory_bytes=s.memory_mb << 20,
                max_prompt_tokens=s.max_prompt_tokens, max_new_tokens=s.max_new_tokens, claimed=claimed))
        except ServeError as exc:
            self.failed[entry.name] = str(exc)
            raise
        scheduler = Scheduler(entry.name, loaded.model, loaded.tokenizer, loaded.eos_id,
                              max_batch=fit.max_batch, memory_bytes=fit.memory_bytes,
                              max_prompt_tokens=s.max_prompt_tokens, max_new_tokens=s.max_new_tokens,
                              queue=s.queue, stats=(stats := ServeStats()), tamper=tamper)
        assert self._nursery is not None
        self._nursery.start_soon(scheduler.run)
        self.served[entry.name] = Served(loaded, scheduler, stats, fit)
        self.failed.pop(entry.name, None)
        self._announce_now()
        log.info("serving %s (%s, hash %s…) on %s in %s, batch %d, KV cache %.0f MiB", entry.name, describe(entry),
                 loaded.model_hash[:16], fit.device, fit.dtype, fit.max_batch,
                 fit.memory_bytes / (1 << 20))
        return {"name": entry.name, "hash": loaded.model_hash, "source": loaded.source, "fit": fit.row()}

    def _tamper(self) -> Tamper | None:
        """A test mesh's lying server (``gpuflex.adversary.serve_tamper``: the node's own
        environment, loopback meshes only); None on every real node."""
        try:
            tamper = serve_tamper(self.mesh.config.listen)
        except ValueError as exc:
            raise ServeError(str(exc)) from None
        if tamper is not None:
            log.warning("TEST ADVERSARY: this node's served answers are corrupted on purpose")
        return tamper

    def capacity(self) -> int:
        """Sequences this node decodes at once: its models' fitted batches (what the device
        holds, ``gpuflex.serve.fit``), or the configured ``max_batch`` before any is loaded."""
        return sum(s.scheduler.max_batch for s in self.served.values()) or self.settings.max_batch

    def _announcement(self) -> dict[str, Any]:
        return {"models": {n: s.loaded.model_hash for n, s in self.served.items()},
                "capacity": self.capacity(), "load": sum(s.scheduler.load for s in self.served.values()),
                "batches": {n: s.scheduler.max_batch for n, s in self.served.items()},
                "stats": node_row([s.stats.row() for s in self.served.values()])}

    def _announce_now(self) -> None:
        body = self._announcement()
        self.directory.update(self.mesh.peer_id, body["models"], body["capacity"], body["load"], body["stats"],
                              body["batches"])
        # The DHT-published NodeInfo names the models too (republished by the mesh).
        self.mesh.config.node_info["serve"] = {"models": body["models"], "capacity": body["capacity"]}

    async def _announce_loop(self) -> None:
        """Load and stats every ``ANNOUNCE_EVERY_S`` while this node serves a model. A node that
        serves none (most of them) says so once: its announcement cannot change until a model
        is loaded, which announces at once (``load``); rebuilding it every second was about 3 %
        of an idle node's task time."""
        self._announce_now()
        while True:
            await trio.sleep(ANNOUNCE_EVERY_S)
            if self.served:
                self._announce_now()
                await self.mesh.broadcast(seal(self.mesh.identity, SERVE_LOAD, self._announcement()))

    async def _on_load(self, msg: Inbound) -> None:
        peer = msg.envelope.sender
        if peer == self.mesh.peer_id:
            return
        try:
            models, capacity, load = parse_announcement(msg.envelope.body)
            stats = parse_stats(msg.envelope.body)
            batches = parse_batches(msg.envelope.body, models)
        except ValueError as exc:
            self.mesh.peers.penalise(peer, 1.0)
            raise Rejected(f"malformed serve_load from {peer[-8:]}: {exc}") from None
        self.directory.update(peer, models, capacity, load, stats, batches)

    # -- generation ------------------------------------------------------------------------------

    async def generate_local(self, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
        served = self.served.get(req.model)
        if served is None:
            raise UnknownModel(f"this node does not serve {req.model!r}")
        text = ""
        try:
            async with aclosing(served.scheduler.generate(req)) as items:
                async for item in items:
                    text += item.get("text", "")
                    if "finish" in item:  # this node's signed record of its answer
                        item["signed"] = seal(self.mesh.identity, SERVE_OUTPUT, {
                            "request": request_digest(req), "text": text, "model_hash": served.loaded.model_hash})
                    yield item
        except ServeError:
            served.stats.failed()
            raise

    async def remote(self, peer: str, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
        frame = seal(self.mesh.identity, INFER, req.to_wire())
        async with self.mesh.request_stream(peer, frame, open_timeout=OPEN_S, item_timeout=ITEM_S) as items:
            async for item in items:
                if not isinstance(item, dict):
                    raise ServeError(f"server {peer[-8:]} sent a garbled item", 502)
                self.directory.heard(peer)
                yield item

    def rtts(self) -> dict[str, float | None]:
        return {rec.peer_id: rec.rtt_ms for rec in self.mesh.peers.all()}

    def penalise(self, peer: str) -> None:
        if peer != self.mesh.peer_id:
            self.mesh.peers.penalise(peer, 1.0)

    def connected(self, peer: str) -> bool:
        return peer in self.mesh.connected_ids()

    async def _serve_peer(self, msg: Inbound, send: Send) -> None:
        """A peer's streamed request for one of this node's models."""
        try:
            req = parse_request(msg.envelope.body)
            async with aclosing(self.generate_local(req)) as items:
                async for item in items:
                    await send(item)
        except ServeError as exc:
            await send({"error": str(exc), "status": exc.status})

    def _checked(self, req: GenRequest) -> GenRequest | None:
        """``req`` as run when it is to be checked on a second server (``redundancy = 2``):
        with log-probabilities, and a seed if it samples; None when it is not checked."""
        if self.settings.redundancy < 2 or random.random() >= self.settings.check_fraction:
            return None
        seed = req.seed if req.seed is not None or req.greedy else random.randrange(2**62)
        return dataclasses.replace(req, logprobs=True, seed=seed)

    async def generate(self, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
        """A request from this node's API, answered wherever the model is served."""
        checked = self._checked(req)
        server: list[str] = []

        async def note(peer: str) -> None:
            server.append(peer)

        answer: Answer = []
        try:
            async with aclosing(self.router.generate(checked or req, on_server=note)) as items:
                async for item in items:
                    if "n" in item:
                        self.served_tokens[server[-1]] += 1
                    if checked is not None and "token" in item:
                        answer.append((int(item["token"]), float(item["logprob"])))
                    if "finish" in item:
                        self.routed.finished(0.0)
                    yield item
        except ServeError:
            self.routed.failed()
            raise
        info = self.directory.servers.get(server[-1]) if server else None
        if checked is not None and info is not None and self._nursery is not None:
            self._nursery.start_soon(self.checker.check, checked, info.models.get(req.model, ""), server[-1], answer)

    # -- batch inference runs ----------------------------------------------------------------------

    async def ask(self, req: GenRequest) -> tuple[str, str, bytes]:
        """One prompt of a batch run: (server, text, its signed record)."""
        server: list[str] = []

        async def note(peer: str) -> None:
            server.append(peer)

        text, frame = "", b""
        async with aclosing(self.router.generate(req, on_server=note)) as items:
            async for item in items:
                text += item.get("text", "")
                if isinstance(item.get("signed"), bytes):
                    frame = item["signed"]
        return server[-1], text, frame

    async def complete(self, req: GenRequest) -> dict[str, Any]:
        """One prompt answered whole, with who answered and how fast (the portal's playground)."""
        server: list[str] = []

        async def note(peer: str) -> None:
            server.append(peer)

        started = trio.current_time()
        text, finish, first_ms = "", "stop", None
        usage: dict[str, Any] = {}
        try:
            async with aclosing(self.router.generate(req, on_server=note)) as items:
                async for item in items:
                    if first_ms is None and ("text" in item or "finish" in item):
                        first_ms = round((trio.current_time() - started) * 1000, 1)
                    text += item.get("text", "")
                    finish, usage = item.get("finish", finish), item.get("usage", usage)
        except ServeError:
            self.routed.failed()
            raise
        total = trio.current_time() - started
        self.routed.finished(total)
        return {"model": req.model, "text": text, "finish": finish, "usage": usage,
                "server": server[-1] if server else "", "first_token_ms": first_ms, "total_ms": round(total * 1000, 1)}

    def start_run(self, spec: InferenceSpec) -> dict[str, Any]:
        run = self.runs.get(spec.run_id)
        if run is None or (run.finished.is_set() and run.error):
            run = self.runs[spec.run_id] = BatchRun(self.home, spec)
            assert self._nursery is not None
            self._nursery.start_soon(self._run, run)
        return run.status()

    async def _run(self, run: BatchRun) -> None:
        with trio.move_on_after(60):  # at start, until some server of the model has spoken
            while not self.directory.choose(run.spec.model, {}):
                await trio.sleep(0.5)
        await run.run(self.ask)

    async def _resume_runs(self) -> None:
        import json

        for path in sorted((self.home / RUNS_DIR).glob("*/spec.json")):
            try:
                raw = json.loads(path.read_text())
                spec = InferenceSpec(**{**raw, "prompts": tuple(raw["prompts"])})
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.error("cannot resume the inference run in %s: %s", path.parent, exc)
                continue
            if spec.run_id == path.parent.name:
                self.start_run(spec)

    def run_of(self, run_id: str) -> BatchRun:
        matches = [r for r in self.runs.values() if r.spec.run_id.startswith(run_id)] if run_id else []
        if len(matches) != 1:
            raise BadRequest(f"no single inference run matches {run_id[:32]!r}")
        return matches[0]

    def model_list(self) -> list[dict[str, Any]]:
        """``/v1/models``: every model some fresh server announces, this node's included."""
        return [{"id": name, "object": "model", "created": 0, "owned_by": "gpuflex", "hash": row["hashes"][0],
                 "servers": len(row["servers"])} for name, row in sorted(self.directory.models().items())]

    def status(self) -> dict[str, Any]:
        return {
            "http": self.http_url,
            "models": [s.row() for _, s in sorted(self.served.items())],
            "failed": dict(self.failed),
            "mesh_models": self.directory.models(),
            "servers": self.directory.server_rows(self.rtts()),
            "taken_in": self.routed.row(),
            "served_tokens": dict(self.served_tokens),
            "runs": [r.status() for r in self.runs.values()],
            "redundancy": {"level": self.settings.redundancy, **self.checker.row()},
        }
