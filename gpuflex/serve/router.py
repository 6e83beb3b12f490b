"""Taking a request anywhere and answering it from wherever the model is served.

A request goes to the best server the directory names (this node itself, or a peer over a
streamed mesh request on the connections rounds use, relayed ones included). If that server
fails before it sends any text, the request is tried on the next (at most ``MAX_TRIES``
servers): no text reached the caller, so nothing is lost or repeated. When every other
server of the model is only full (it has as many of this node's requests as it takes), the
request waits for room there (``FAILOVER_WAIT_S`` at most) rather than being lost: the
requests queued on a server that dies must land on the survivors. Once text has gone out, a
failure ends the request with an error naming the server, since a second server would not
continue the same sampled text.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol

import trio

from gpuflex.serve import BadRequest, Overloaded, ServeError, UnknownModel
from gpuflex.serve.directory import Directory
from gpuflex.serve.request import GenRequest
from mesh.messaging import SendError

log = logging.getLogger("gpuflex.serve")
MAX_TRIES = 3
#: Opening a stream to a server, and the longest silence between two of its items (a full
#: batch's prefill on a slow CPU fits well inside it).
OPEN_S, ITEM_S = 10.0, 120.0
#: A request whose server failed before answering waits this long, at most, for room at a
#: server of the model that is only full; then it is refused as busy (429).
FAILOVER_WAIT_S, ROOM_POLL_S = 30.0, 0.05

Local = Callable[[GenRequest], AsyncGenerator[dict[str, Any], None]]


class RemoteServers(Protocol):
    """How the router reaches a peer that serves (``service.ServeService``)."""

    def remote(self, peer: str, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]: ...

    def rtts(self) -> dict[str, float | None]: ...

    def penalise(self, peer: str) -> None: ...


def error_of(item: dict[str, Any]) -> ServeError:
    """The ServeError a server's error item stands for (its status, bounded)."""
    status = item.get("status")
    message = str(item.get("error"))[:500]
    if status == 404:
        return UnknownModel(message)
    if status == 429:
        return Overloaded(message)
    if status == 400:
        return BadRequest(message)
    return ServeError(message, 502)


class Router:
    def __init__(self, own_id: str, directory: Directory, local: Local, servers: RemoteServers) -> None:
        self.own_id, self.directory, self.local, self.servers = own_id, directory, local, servers

    def _source(self, peer: str, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
        return self.local(req) if peer == self.own_id else self.servers.remote(peer, req)

    async def generate(self, req: GenRequest, model_hash: str | None = None,
                       exclude: frozenset[str] = frozenset(), on_server: Callable[[str], Awaitable[None]] | None = None,
                       ) -> AsyncGenerator[dict[str, Any], None]:
        """The request's items from the best server; fails over before its first item."""
        tried: set[str] = set(exclude)
        reasons: list[str] = []
        busy = 0  # servers that refused only because their queue was full
        full = False  # a server failed, and the others stayed full for FAILOVER_WAIT_S
        for _ in range(MAX_TRIES):
            choice = self.directory.choose(req.model, self.servers.rtts(), tried, model_hash)
            if not choice and reasons and self._full_elsewhere(req.model, tried, model_hash):
                choice = await self._wait_for_room(req, tried, model_hash)
                full = not choice and self._full_elsewhere(req.model, tried, model_hash)
            if not choice:
                break
            peer = choice[0]
            tried.add(peer)
            if on_server is not None:
                await on_server(peer)
            got = 0
            self.directory.routed(peer)
            try:
                async for item in self._source(peer, req):
                    if "error" in item:
                        raise error_of(item)
                    if item.get("text"):
                        got += 1  # text reached the caller: a retry would repeat or change it
                    yield item
                return
            except (SendError, Overloaded) as exc:
                if got:
                    raise ServeError(f"the server {peer[-8:]} stopped after {got} pieces of the answer: {exc}",
                                     502) from None
                log.info("server %s failed before answering (%s); trying another", peer[-8:], exc)
                reasons.append(f"{peer[-8:]}: {exc}")
                if isinstance(exc, Overloaded):
                    busy += 1
                else:
                    self.directory.failed(peer)
            except ServeError as exc:
                if got or exc.status in (400, 404) or peer == self.own_id:
                    raise
                reasons.append(f"{peer[-8:]}: {exc}")
                self.directory.failed(peer)
            finally:
                self.directory.returned(peer)
        if not reasons and self.directory.serves(req.model):
            raise Overloaded(f"every server of {req.model!r} has as many of this node's requests as it takes")
        if not reasons:
            known = ", ".join(sorted(self.directory.models())) or "none"
            raise UnknownModel(f"no node serves model {req.model!r} (served now: {known})")
        if busy == len(reasons):
            raise Overloaded(f"every server of {req.model!r} is busy; try again shortly")
        if full:
            raise Overloaded(f"a server of {req.model!r} failed before answering and every other stayed busy; "
                             f"try again shortly ({'; '.join(reasons)})")
        raise ServeError(f"every server of {req.model!r} failed before answering: {'; '.join(reasons)}", 503)

    def _full_elsewhere(self, model: str, tried: set[str], model_hash: str | None) -> bool:
        """Whether a server of ``model`` not tried yet and not failed lately is left out of the
        choice only because it has as many of this node's requests as it takes."""
        return any(not self.directory.has_room(peer, info)
                   for peer, info in self.directory.candidates(model, tried, model_hash).items())

    async def _wait_for_room(self, req: GenRequest, tried: set[str], model_hash: str | None) -> list[str]:
        """The servers to try once one of them has room (``FAILOVER_WAIT_S`` at most), or []."""
        deadline = trio.current_time() + FAILOVER_WAIT_S
        while trio.current_time() < deadline and self._full_elsewhere(req.model, tried, model_hash):
            await trio.sleep(ROOM_POLL_S)
            choice = self.directory.choose(req.model, self.servers.rtts(), tried, model_hash)
            if choice:
                return choice
        return []
