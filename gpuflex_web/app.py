"""The portal as an ASGI app: routes, templates, the live stream, downloads and the audit.

Starlette runs on anyio, which runs on trio, and Hypercorn has a trio worker, so the portal
lives in the same concurrency model as the node: one trio nursery holds the server, the hub's
poller and the event follower, and a stop cancels all of them together.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import trio
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gpuflex_web import filters
from gpuflex_web.credit import compute_credit, credit_csv
from gpuflex_web.exports import FILES, Exporter, ExportError, MissingFile, Verdict, downloads_for
from gpuflex_web.hub import Hub, Snapshot
from gpuflex_web.security import COOKIE, Guard, safe_next, session_value
from gpuflex_web.serving import DEADLINE_S, MAX_ASKING, MAX_BODY, BadForm, Busy, parse_form
from gpuflex_web.source import NodeRefused, NodeUnavailable, Source
from gpuflex_web.views import PAGES, Page
from gpuflex_web.wheel import WheelFinder

STATIC = Path(__file__).parent / "static"
KEEPALIVE_S = 15.0
MAX_FORM = 4096


def make_env() -> Environment:
    env = Environment(loader=PackageLoader("gpuflex_web", "templates"),
                      autoescape=select_autoescape(["html"], default=True),
                      trim_blocks=True, lstrip_blocks=True)
    filters.install(env)
    return env


class Portal:
    """The app's state: one hub, one exporter, the templates, and the login token if any."""

    def __init__(self, source: Source, *, token: str | None = None, interval: float = 1.0,
                 exporter: Exporter | None = None, wall_clock: Callable[[], float] = time.time,
                 version: str = "", wheel_dirs: Sequence[Path] = ()) -> None:
        self.source = source
        self.hub = Hub(source, interval=interval, wall_clock=wall_clock)
        self.exporter = exporter or Exporter(source)
        self.token = token
        self.env = make_env()
        self.wheels = WheelFinder(version, wheel_dirs)
        self.env.globals["wheel"] = self.wheels.find  # the Join page's install step
        self.wall_clock = wall_clock
        self.version = version
        self._nursery: trio.Nursery | None = None
        self._fetching: set[str] = set()
        self._asking = 0  # playground prompts in flight

    # -- rendering ----------------------------------------------------------------------------

    def regions(self, page: Page, snap: Snapshot, params: Mapping[str, str]) -> dict[str, Markup]:
        ctx = self._context(page, snap, params)
        out = {"banner": Markup(self.env.get_template("regions/banner.html").render(ctx)),
               "clock": escape(filters.clock(snap.polled_at))}
        for name in page.regions:
            out[name] = Markup(self.env.get_template(f"regions/{page.name}_{name}.html").render(ctx))
        return out

    def _context(self, page: Page, snap: Snapshot, params: Mapping[str, str]) -> dict[str, Any]:
        return {**page.view(snap, params), "snap": snap, "now": self.wall_clock(), "page": page.name,
                "params": params, "logged_in": self.token is not None, "version": self.version,
                "spec_of": self._spec_of, "downloads_of": self._downloads_of}

    def _spec_of(self, job: Any) -> tuple[Mapping[str, Any] | None, str]:
        """(spec, why not) for the job page: from the summary when the node sends it, else
        from the exported files once they are here."""
        spec = job.spec or self.exporter.cached_spec(job.job_id)
        return spec, "" if spec else self.exporter.spec_errors.get(job.job_id, "")

    def _downloads_of(self, job: Any) -> dict[str, str]:
        """The files the job page offers, labelled for this job (its spec says which model file)."""
        return downloads_for(job, self._spec_of(job)[0])

    def render(self, page: Page, snap: Snapshot, params: Mapping[str, str], live: str,
               status_code: int = 200, **extra: Any) -> HTMLResponse:
        ctx = {**self._context(page, snap, params), "regions": self.regions(page, snap, params),
               "title": extra.pop("title", page.title), "live_url": live, **extra}
        html = self.env.get_template(page.template).render(ctx)
        return HTMLResponse(html, status_code=status_code)

    # -- handlers -----------------------------------------------------------------------------

    def page(self, name: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return self.render(PAGES[name], await self.hub.fresh(), dict(request.query_params),
                               live=f"/live/{name}?{request.url.query}")

        return endpoint

    async def job(self, request: Request, verdict: Verdict | None = None) -> Response:
        job_id = request.path_params["job_id"]
        snap = await self.hub.fresh()
        job = snap.job(job_id)
        if job is None:
            if snap.connected is False:  # not "no such job": the node cannot say
                return self.render(PAGES["job"], snap, {"job": job_id}, live="", status_code=503,
                                   title="Node not answering")
            return self.render(PAGES["job"], snap, {"job": job_id}, live="", status_code=404,
                               title="No such job")
        if job.spec is None and self.exporter.cached_spec(job.job_id) is None and snap.connected:
            self._fetch_spec(job.job_id, job.round)
        params = {"job": job_id, **({"page": request.query_params["page"]} if "page" in request.query_params else {})}
        return self.render(PAGES["job"], snap, params, live="/live/job?" + urlencode({**params, "job": job.job_id}),
                           title=f"Job {job.label}", verdict=verdict)

    def _fetch_spec(self, job_id: str, round_: int) -> None:
        """Ask the node for the job's spec in the background (``job_status``; an older node
        writes the job's files, which can take seconds): the page answers at once and the spec
        arrives with the next live update."""
        if job_id in self._fetching or self._nursery is None:
            return
        self._fetching.add(job_id)

        async def fetch() -> None:
            try:
                await self.exporter.spec(job_id, round_)
            finally:
                self._fetching.discard(job_id)

        self._nursery.start_soon(fetch)

    async def audit(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = (await self.hub.fresh()).job(job_id)
        if job is None:
            verdict = Verdict(False, "No such job on this node.")
        else:
            try:
                verdict = await self.exporter.audit(job.job_id, job.round)
            except (ExportError, NodeUnavailable) as exc:
                verdict = Verdict(False, f"Could not fetch the ledger from the node: {exc}")
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({"ok": verdict.ok, "text": verdict.text, "rounds": verdict.rounds,
                                 "round": verdict.bad_round})
        return await self.job(request, verdict=verdict)

    async def download(self, request: Request) -> Response:
        job_id, name = request.path_params["job_id"], request.path_params["name"]
        job = (await self.hub.fresh()).job(job_id)
        if job is None or name not in FILES:
            return PlainTextResponse("no such job or file", status_code=404)
        try:
            path = await self.exporter.file(job.job_id, job.round, name)
        except MissingFile as exc:  # the job has no such file (a language model has no model.pt)
            return PlainTextResponse(str(exc), status_code=404)
        except (ExportError, NodeUnavailable) as exc:
            return PlainTextResponse(f"could not fetch {name} from the node: {exc}", status_code=502)
        return FileResponse(path, filename=f"{job.job_id}-{name}",
                            media_type="application/octet-stream")

    async def credit_csv(self, request: Request) -> Response:
        snap = await self.hub.fresh()
        return Response(credit_csv(compute_credit(snap.ledgers)), media_type="text/csv; charset=utf-8",
                        headers={"content-disposition": 'attachment; filename="contributions.csv"'})

    async def wheel_file(self, request: Request) -> Response:
        """The node's own wheel, by its one known name; the request's name is only compared."""
        wheel = await trio.to_thread.run_sync(self.wheels.find)
        if wheel is None or request.path_params["name"] != wheel.name:
            return PlainTextResponse("no such file", status_code=404)
        return FileResponse(wheel.path, filename=wheel.name, media_type="application/octet-stream",
                            headers={"x-checksum-sha256": wheel.sha256})

    async def playground(self, request: Request) -> Response:
        """A prompt from the playground's form, sent through the node's router; the page
        again with the answer (or the reason there is none)."""
        snap = await self.hub.fresh()
        body = await _small_body(request, MAX_BODY + 1)
        extra: dict[str, Any] = {}
        try:
            ask = parse_form(body)
            extra["ask"] = ask
            if self._asking >= MAX_ASKING:
                raise Busy(f"{MAX_ASKING} prompts are being answered already; send it again shortly")
            self._asking += 1
            try:
                extra["answer"] = await self.source.call("serve_complete", ask.params(), timeout=DEADLINE_S)
            finally:
                self._asking -= 1
            status = 200
        except BadForm as exc:
            extra["problem"], status = str(exc), 429 if isinstance(exc, Busy) else 400
        except NodeRefused as exc:
            extra["problem"], status = str(exc), 502
        except NodeUnavailable as exc:
            extra["problem"], status = f"the node did not answer: {exc}", 503
        return self.render(PAGES["playground"], snap, {}, live="", status_code=status, **extra)

    async def live(self, request: Request) -> Response:
        page = PAGES.get(request.path_params["page"])
        if page is None:
            return PlainTextResponse("no such page", status_code=404)
        params = dict(request.query_params)
        return StreamingResponse(self._stream(page, params), media_type="text/event-stream",
                                 headers={"x-accel-buffering": "no"})

    async def _stream(self, page: Page, params: Mapping[str, str]) -> AsyncIterator[bytes]:
        """Server-sent events: one ``update`` per new snapshot (so at most one a second), a
        comment every 15 s to keep proxies from closing an idle stream."""
        with self.hub.watching():
            yield b"retry: 2000\n\n"
            snap = await self.hub.fresh()
            sent = -1
            while True:
                if snap.version != sent:
                    msg = {"version": snap.version, "connected": snap.connected,
                           "regions": {k: str(v) for k, v in self.regions(page, snap, params).items()}}
                    yield b"event: update\ndata: " + json.dumps(msg).encode() + b"\n\n"
                    sent = snap.version
                else:
                    yield b": keep-alive\n\n"
                snap = await self.hub.wait_newer(sent, KEEPALIVE_S)

    async def login_page(self, request: Request) -> Response:
        if self.token is None:
            return RedirectResponse("/", status_code=303)
        nxt = safe_next(request.query_params.get("next", "/"))
        html = self.env.get_template("login.html").render(next=nxt, error="", title="Log in")
        return HTMLResponse(html)

    async def login(self, request: Request) -> Response:
        body = await _small_body(request)
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        nxt = safe_next(form.get("next", "/"))
        if self.token is None:
            return RedirectResponse(nxt, status_code=303)
        if not hmac.compare_digest(form.get("token", "").strip(), self.token):
            await trio.sleep(0.5)  # a wrong token costs the guesser time
            html = self.env.get_template("login.html").render(
                next=nxt, error="That is not this portal's token.", title="Log in")
            return HTMLResponse(html, status_code=401)
        resp = RedirectResponse(nxt, status_code=303)
        resp.set_cookie(COOKIE, session_value(self.token), httponly=True, samesite="strict", path="/")
        return resp

    async def logout(self, request: Request) -> Response:
        resp = RedirectResponse("/login" if self.token else "/", status_code=303)
        resp.delete_cookie(COOKIE, path="/")
        return resp

    # -- assembly -----------------------------------------------------------------------------

    def app(self) -> Guard:
        routes = [
            Route("/", self.page("overview")),
            Route("/peers", self.page("peers")),
            Route("/jobs", self.page("jobs")),
            Route("/jobs/{job_id}", self.job),
            Route("/jobs/{job_id}/audit", self.audit, methods=["POST"]),
            Route("/jobs/{job_id}/files/{name}", self.download),
            Route("/contributions", self.page("contributions")),
            Route("/contributions.csv", self.credit_csv),
            Route("/join", self.page("join")),
            Route("/serving", self.page("serving")),
            Route("/playground", self.page("playground"), methods=["GET"]),
            Route("/playground", self.playground, methods=["POST"]),
            Route("/dist/{name}", self.wheel_file),
            Route("/live/{page}", self.live),
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.hub.run)
                self._nursery = nursery
                try:
                    yield
                finally:
                    nursery.cancel_scope.cancel()
                    self.exporter.close()
                    await self.source.aclose()

        return Guard(Starlette(routes=routes, lifespan=lifespan), self.token)


async def _small_body(request: Request, limit: int = MAX_FORM) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            break
    return body[:limit]
