"""The OpenAI-compatible HTTP API: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``, streamed as server-sent events when asked.

Binding follows the web portal's rules (docs/web.md): on loopback (the default) no token,
but only requests whose Host names loopback are answered (a web page cannot reach the API by
DNS rebinding); on any other address every request needs ``Authorization: Bearer <token>``,
the token in ``<home>/serve.token`` (0600). The API key the ``openai`` client sends on
loopback is ignored. Bodies are capped, requests in flight are capped, and every error is a
JSON ``{"error": {...}}`` with a one-line message.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gpuflex.localauth import is_loopback, load_or_create_token
from gpuflex.serve import BadRequest, ServeError
from gpuflex.serve.request import GenRequest, parse_request

log = logging.getLogger("gpuflex.serve")
TOKEN_FILE = "serve.token"
MAX_BODY = 1 << 20
#: HTTP requests in flight at once; more are answered 429 at once.
MAX_IN_FLIGHT = 256
MAX_MESSAGES = 256


class Service(Protocol):
    home: Any

    def generate(self, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]: ...

    def model_list(self) -> list[dict[str, Any]]: ...


#: What a 429 tells the caller to wait before asking again (seconds): a batch on a busy server
#: frees a place within about that, and clients (``openai``'s among them) honour it.
RETRY_AFTER_S = 1


def error(status: int, message: str, kind: str | None = None) -> JSONResponse:
    kind = kind or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                    413: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else None
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status,
                        headers=headers)


def chat_prompt(messages: Any) -> str:
    """A plain transcript (``role: content`` lines, then ``assistant:``): the models trained
    here have no chat template, and one from a local directory is not trusted to run."""
    if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
        raise BadRequest(f"'messages' must be a list of 1 to {MAX_MESSAGES} messages")
    lines = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRequest("each message needs a 'role' and a string 'content'")
        lines.append(f"{m['role'][:32]}: {m['content']}")
    return "\n".join(lines) + "\nassistant:"


class Api:
    def __init__(self, service: Service, token: str | None) -> None:
        self.service, self.token = service, token
        self.in_flight = 0

    def check(self, request: Request) -> Response | None:
        if self.token is None:
            host = request.headers.get("host", "")
            name = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
            if name and not is_loopback(name):  # no Host header at all: a local client
                return error(421, "this API answers to 127.0.0.1 and localhost only")
            return None
        auth = request.headers.get("authorization", "")
        if not (auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip(), self.token)):
            return error(401, "a valid 'Authorization: Bearer <token>' is needed (the token is in serve.token)")
        return None

    async def body(self, request: Request) -> Any:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > MAX_BODY):
            raise ServeError(f"the body is over {MAX_BODY} bytes", 413)
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                raise ServeError(f"the body is over {MAX_BODY} bytes", 413)
        try:
            return json.loads(bytes(data))
        except ValueError:
            raise BadRequest("the body is not valid JSON") from None

    async def models(self, request: Request) -> Response:
        return self.check(request) or JSONResponse({"object": "list", "data": self.service.model_list()})

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def _complete(self, request: Request, chat: bool) -> Response:
        refused = self.check(request)
        if refused is not None:
            return refused
        if self.in_flight >= MAX_IN_FLIGHT:
            return error(429, f"{MAX_IN_FLIGHT} requests are in flight on this node; try again shortly")
        self.in_flight += 1
        try:
            body = await self.body(request)
            if chat and isinstance(body, dict):
                body = {**body, "prompt": chat_prompt(body.get("messages"))}
            req = parse_request(body)
            stream = body.get("stream") is True
            items = self.service.generate(req)
            first = await _first(items)  # errors before any text become a plain error reply
        except ServeError as exc:
            self.in_flight -= 1
            return error(exc.status, str(exc))
        except BaseException:
            self.in_flight -= 1
            raise
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
        if stream:
            return StreamingResponse(self._sse(ident, req, chat, first, items), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            text, finish = first.get("text", ""), "stop"
            usage: dict[str, Any] = {}
            async with aclosing(items):
                async for item in items:
                    text += item.get("text", "")
                    finish, usage = item.get("finish", finish), item.get("usage", usage)
        except ServeError as exc:
            return error(exc.status, str(exc))
        finally:
            self.in_flight -= 1
        if "finish" in first:
            finish, usage = first["finish"], first.get("usage", usage)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({"id": ident, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": req.model, "choices": [choice], "usage": usage})

    async def _sse(self, ident: str, req: GenRequest, chat: bool, first: dict[str, Any],
                   items: AsyncGenerator[dict[str, Any], None]) -> AsyncIterator[str]:
        created = int(time.time())

        def event(piece: str | None, finish: str | None, usage: Any = None, role: bool = False) -> str:
            if chat:
                delta: dict[str, str] = {} if piece is None else {"content": piece}
                if role:
                    delta["role"] = "assistant"
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                obj = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": req.model,
                       "choices": [choice]}
            else:
                obj = {"id": ident, "object": "text_completion", "created": created, "model": req.model,
                       "choices": [{"index": 0, "text": piece or "", "finish_reason": finish, "logprobs": None}]}
            if usage:
                obj["usage"] = usage
            return f"data: {json.dumps(obj)}\n\n"

        try:
            if chat:
                yield event("", None, role=True)
            async with aclosing(items):
                item: dict[str, Any] | None = first
                while item is not None:
                    if item.get("text"):
                        yield event(item["text"], None)
                    if "finish" in item:
                        yield event(None, str(item["finish"]), item.get("usage"))
                    item = await anext(items, None)
            yield "data: [DONE]\n\n"
        except ServeError as exc:
            err = {"error": {"message": str(exc), "type": "server_error", "code": exc.status}}
            yield f"data: {json.dumps(err)}\n\n"
        finally:
            self.in_flight -= 1


async def _first(items: AsyncGenerator[dict[str, Any], None]) -> dict[str, Any]:
    try:
        return await anext(items)
    except StopAsyncIteration:
        raise ServeError("the server ended the answer before it began", 502) from None


def build_app(service: Service, token: str | None) -> Starlette:
    api = Api(service, token)

    async def failed(request: Request, exc: Exception) -> Response:
        log.exception("serving API request failed")
        return error(500, f"the request failed: {exc.__class__.__name__}")

    return Starlette(routes=[
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
    ], exception_handlers={Exception: failed})


async def serve_http(service: Service, host: str, port: int, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    import socket

    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    if port:  # a taken port fails here with a plain OSError, not inside Hypercorn's task group
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    token = None if is_loopback(host) else load_or_create_token(service.home / TOKEN_FILE)
    cfg = Config()
    cfg.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("gpuflex.serve.http")
    cfg.include_server_header = False
    cfg.graceful_timeout = 1.0
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(hypercorn_serve, build_app(service, token), cfg)
        task_status.started(urls[0].rstrip("/") if urls else f"http://{cfg.bind[0]}")
