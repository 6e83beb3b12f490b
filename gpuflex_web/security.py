"""Who may see the portal, and what every response tells the browser.

- On loopback (the default) anyone on this machine may look, as with the node's metrics
  endpoint; the Host header must name loopback, so a web page elsewhere cannot reach the
  portal by rebinding its own DNS name to 127.0.0.1.
- On any other address a login token is required. It lives in ``<home>/web.token`` (mode
  0600), separate from the node's control token, which can stop the node. A browser logs in
  once and keeps an HttpOnly, SameSite=Strict cookie; scripts send ``Authorization: Bearer``.
- Every response carries a content security policy that allows scripts, styles and images
  from the portal itself and nothing else, so no inline script can ever run.
- A state-changing request (any method but GET and HEAD) needs same-origin proof: an
  ``Origin`` naming this portal, or (from a client that sends none) ``Sec-Fetch-Site:
  same-origin``, a ``Referer`` on this portal or a valid ``Authorization: Bearer``; a POST
  with none of these is refused, since a page elsewhere can have one sent.
- A request another site caused (``Sec-Fetch-Site: cross-site`` or ``same-site``, or a
  ``Referer`` elsewhere) does no work: only a top-level navigation to the overview or the login
  page is answered; a download or a job page, which start an export on the node, are refused.
- Log-in attempts (a POST to /login, a wrong bearer token) are throttled per client address
  and in total (``LoginThrottle``), answered with 429 past the budget.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from gpuflex.localauth import is_loopback
from gpuflex.localauth import load_or_create_token as load_token_file
from gpuflex_web import WebError

TOKEN_FILE = "web.token"
COOKIE = "gpuflex_web"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
OPEN_PATHS = ("/login", "/static/")
#: Pages that another site may link to: they only read the snapshot the portal already holds.
NAVIGABLE = ("/", "/login")
SAFE_METHODS = ("GET", "HEAD")
#: Log-in attempts: a burst per client address, then one per ``LOGIN_EVERY_S``; and, for all
#: addresses together, ``LOGIN_TOTAL_BURST`` then one per ``LOGIN_TOTAL_EVERY_S``.
LOGIN_BURST, LOGIN_EVERY_S = 5, 2.0
LOGIN_TOTAL_BURST, LOGIN_TOTAL_EVERY_S = 20, 0.5
#: Client addresses the throttle remembers; the least recently seen is forgotten first.
LOGIN_ADDRESSES = 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def load_or_create_token(home: Path) -> str:
    """The portal's login token: 64 hex characters, created once, kept in a 0600 file."""
    path = home / TOKEN_FILE
    try:
        home.mkdir(parents=True, exist_ok=True)
        return load_token_file(path)
    except OSError as exc:
        raise WebError(f"cannot use the login token file {path}: {exc.strerror or exc}") from None


def session_value(token: str) -> str:
    """What the login cookie holds: derived from the token, so the token itself never sits in
    a cookie, and a new token (delete web.token) logs every browser out."""
    return hmac.new(token.encode(), b"gpuflex-web-session", hashlib.sha256).hexdigest()


def safe_next(target: str) -> str:
    """Where to go after login: a path on this portal, never another site."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return ""


def host_name(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class _Bucket:
    def __init__(self, burst: int, every_s: float, now: float) -> None:
        self.burst, self.every_s, self.level, self.at = burst, every_s, float(burst), now

    def take(self, now: float) -> float:
        """0 when an attempt may go ahead now (and it is counted), else seconds to wait."""
        self.level = min(self.burst, self.level + (now - self.at) / self.every_s)
        self.at = now
        if self.level >= 1:
            self.level -= 1
            return 0.0
        return (1 - self.level) * self.every_s


class LoginThrottle:
    """Token buckets for log-in attempts, one per client address and one for all of them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._total = _Bucket(LOGIN_TOTAL_BURST, LOGIN_TOTAL_EVERY_S, clock())
        self._per: OrderedDict[str, _Bucket] = OrderedDict()

    def wait_s(self, address: str) -> float:
        """0 if this attempt may go ahead (it is counted), else seconds until one may."""
        now = self.clock()
        bucket = self._per.get(address)
        if bucket is None:
            bucket = self._per[address] = _Bucket(LOGIN_BURST, LOGIN_EVERY_S, now)
            while len(self._per) > LOGIN_ADDRESSES:
                self._per.popitem(last=False)
        self._per.move_to_end(address)
        wait = bucket.take(now)
        return wait or self._total.take(now)


class Guard:
    """ASGI middleware: security headers on every response, Host, origin, throttle and login
    checks before any handler runs. Pure ASGI (not BaseHTTPMiddleware) so live streams pass
    through untouched."""

    def __init__(self, app: ASGIApp, token: str | None, throttle: LoginThrottle | None = None) -> None:
        self.app = app
        self.token = token
        self.session = session_value(token) if token else None
        self.throttle = throttle or LoginThrottle()

    def bearer(self, scope: Scope) -> bool | None:
        """Whether the request's bearer token is right; None when it shows none."""
        auth = _header(scope, b"authorization")
        if not auth.startswith("Bearer "):
            return None
        return self.token is not None and hmac.compare_digest(auth[7:].strip(), self.token)

    def authorized(self, scope: Scope) -> bool:
        if self.token is None:
            return True
        if self.bearer(scope):
            return True
        cookie = SimpleCookie()
        try:
            cookie.load(_header(scope, b"cookie"))
        except Exception:
            return False
        morsel = cookie.get(COOKIE)
        return morsel is not None and self.session is not None and hmac.compare_digest(
            morsel.value, self.session)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        path = str(scope.get("path", "/"))
        if self.token is None and not is_loopback(host_name(_header(scope, b"host"))):
            await _plain(send_with_headers, 421, "this portal answers to 127.0.0.1 and localhost only")
            return
        method = str(scope.get("method", "GET"))
        if method not in SAFE_METHODS and not (_same_origin(scope) or self.bearer(scope)):
            await _plain(send_with_headers, 403, "cross-site request refused: no same-origin proof")
            return
        if _cross_site(scope) and not (method in SAFE_METHODS and path in NAVIGABLE
                                       and _header(scope, b"sec-fetch-mode") in ("navigate", "")):
            await _plain(send_with_headers, 403, "cross-site request refused: open the portal itself")
            return
        if (method == "POST" and path == "/login") or self.bearer(scope) is False:
            client = scope.get("client") or ("", 0)
            wait = self.throttle.wait_s(str(client[0]))
            if wait:
                await _plain(send_with_headers, 429, f"too many log-in attempts: try again in {wait:.0f} s",
                             [(b"retry-after", str(max(1, round(wait))).encode())])
                return
        if not path.startswith(OPEN_PATHS) and not self.authorized(scope):
            if scope.get("method") == "GET" and _wants_html(scope):
                query = str(scope.get("query_string", b"").decode("latin-1"))
                target = path + ("?" + query if query else "")
                await _redirect(send_with_headers, "/login?" + _q("next", target))
            else:
                await _plain(send_with_headers, 401, "log in first: see `gpuflex web --help`")
            return
        await self.app(scope, receive, send_with_headers)


def _same_origin(scope: Scope) -> bool:
    """Proof that this portal's own page sent the request: browsers send Origin on every POST,
    and a form posted from another site (or a sandboxed frame, "null") names another origin.
    With no Origin, the fetch metadata or the Referer must name this portal; with neither
    the request is refused (a client that sends none can send a bearer token or an Origin)."""
    host = _header(scope, b"host")
    origin = _header(scope, b"origin")
    if _header(scope, b"sec-fetch-site") == "same-origin":
        # The browser's own word, which no page can set. It is what tells a form posted from
        # the portal's own page apart: under the portal's ``no-referrer`` policy a browser
        # sends that form's Origin as "null".
        return not origin or origin == "null" or urlsplit(origin).netloc == host
    if origin:
        return urlsplit(origin).netloc == host
    referer = _header(scope, b"referer")
    return bool(referer) and urlsplit(referer).netloc == host


def _cross_site(scope: Scope) -> bool:
    """Whether another site caused this request (a link, an image, a script, a frame): by the
    browser's fetch metadata, or by a Referer elsewhere where a browser sends none."""
    site = _header(scope, b"sec-fetch-site")
    if site:
        return site not in ("same-origin", "none")
    referer = _header(scope, b"referer")
    return bool(referer) and urlsplit(referer).netloc != _header(scope, b"host")


def _wants_html(scope: Scope) -> bool:
    return "text/html" in _header(scope, b"accept") or not _header(scope, b"accept")


def _q(key: str, value: str) -> str:
    return urlencode({key: value})


async def _plain(send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str) -> None:
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode("latin-1")), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
