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

A server that could not take the request is either busy or failed, and the two are answered
differently: a busy one is tried again by later requests and, when every server tried was
busy, the caller is told 429 (ask again shortly); a failed one is left out for a while
(``directory.FAILED_S``) and, when every server failed, the caller is told 503. Busy is a
server's own refusal (its queue is full), or a stream to it that could not be opened or was
reset before its first item *while the evidence says it is alive and loaded* (``_only_busy``):
the connection to it is still open, it is heard from after the failure (an announcement, or a
piece of another answer), and it holds at least the model's full batch. A peer at its stream
limit resets new streams, and a loaded, CPU-starved one takes them late; a dead one's
connection closes and it falls silent, so it stays a failure and the request waits for room at
the survivors.
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
#: A server whose stream failed before its first item must show it is alive within PROOF_S
#: (its announcements come every second), SETTLE_S after the failure, for the failure to count
#: as busy rather than as its death.
SETTLE_S, PROOF_S = 0.05, 1.5

Local = Callable[[GenRequest], AsyncGenerator[dict[str, Any], None]]


class RemoteServers(Protocol):
    """How the router reaches a peer that serves (``service.ServeService``)."""

    def remote(self, peer: str, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]: ...

    def rtts(self) -> dict[str, float | None]: ...

    def penalise(self, peer: str) -> None: ...

    def connected(self, peer: str) -> bool:
        """Whether this node holds an open connection to ``peer`` now."""
        ...


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
        busy = 0  # servers that were only busy (their queue full, or streams refused under load)
        full = False  # a server failed, and the others stayed full for FAILOVER_WAIT_S
        for _ in range(MAX_TRIES):
            choice = self.directory.choose(req.model, self.servers.rtts(), tried, model_hash)
            # Waiting for room is for the requests of a server that failed (they must land on the
            # survivors); a request every server it tried refused as busy is refused at once, so
            # a flood gets its 429s rather than a hidden queue of up to FAILOVER_WAIT_S.
            if not choice and busy < len(reasons) and self._full_elsewhere(req.model, tried, model_hash):
                choice = await self._wait_for_room(req, tried, model_hash)
                full = not choice and self._full_elsewhere(req.model, tried, model_hash)
            if not choice:
                break
            peer = choice[0]
            tried.add(peer)
            got = 0
            self.directory.routed(peer)  # before any await: requests arriving together see each other
            try:
                if on_server is not None:
                    await on_server(peer)
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
                reasons.append(f"{peer[-8:]}: {exc}")
                if isinstance(exc, Overloaded) or (peer != self.own_id and await self._only_busy(peer, req.model)):
                    log.info("server %s is busy (%s); trying another", peer[-8:], exc)
                    busy += 1
                else:
                    log.info("server %s failed before answering (%s); trying another", peer[-8:], exc)
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
        if full or busy:  # a server of the model is alive, only busy: asking again will find room
            raise Overloaded(f"a server of {req.model!r} failed before answering and every other stayed busy; "
                             f"try again shortly ({'; '.join(reasons)})")
        raise ServeError(f"every server of {req.model!r} failed before answering: {'; '.join(reasons)}", 503)

    async def _only_busy(self, peer: str, model: str) -> bool:
        """Whether ``peer``, whose stream failed before its first item, is alive and only busy:
        after ``SETTLE_S`` (a dead peer's connection is closed by then, and what it sent before
        dying has been read), its connection is still open, it is heard from anew (an
        announcement or a piece of another answer, within ``PROOF_S``), and it holds at least
        ``model``'s full batch (by its announcement and this node's own requests there)."""
        await trio.sleep(SETTLE_S)
        since = trio.current_time()
        deadline = since + PROOF_S
        while self.servers.connected(peer):
            info = self.directory.servers.get(peer)
            if info is None:
                return False
            if info.at > since:
                return info.requests() >= info.batch(model)
            if trio.current_time() >= deadline:
                return False
            await trio.sleep(ROOM_POLL_S)
        return False

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
