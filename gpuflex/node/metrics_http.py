"""An opt-in Prometheus endpoint (``gpuflex node start --metrics ADDR``).

People who run GPUFlex nodes already watch their machines with Prometheus and Grafana, so a
node can expose its health in the text exposition format. It is a tiny HTTP/1.0 server on
trio (no extra dependency) that answers ``GET /metrics`` and nothing else, and it listens on
loopback unless the user names another address: the metrics reveal peer ids and job ids.

Counters are fed by the node's own event log (the same stream the dashboard reads), so the
round protocol knows nothing about metrics; gauges for peers and bytes are read at scrape time.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any

import trio

from gpuflex.errors import GpuflexError

log = logging.getLogger("gpuflex.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
MAX_REQUEST = 8192
REQUEST_TIMEOUT_S = 5.0


class MetricsAddrError(GpuflexError, ValueError):
    """``--metrics`` is not ``PORT`` or ``HOST:PORT``."""


def parse_metrics_addr(text: str) -> tuple[str, int]:
    """``9464`` and ``:9464`` mean loopback; ``HOST:PORT`` and ``[v6]:PORT`` are taken as given."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = "", text.strip()
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise MetricsAddrError(f"--metrics must be PORT or HOST:PORT, got {text!r}") from None
    if not 0 <= number <= 65535:
        raise MetricsAddrError(f"--metrics port must be 0-65535, got {number}")
    return host, number


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: Any) -> str:
    inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
    return f"{{{inner}}}" if inner else ""


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class MetricsState:
    """Counters and gauges built from node events; pure, so it is tested without a network."""

    def __init__(self) -> None:
        self.rounds: dict[str, int] = defaultdict(int)
        self.duration_buckets: dict[str, list[int]] = {}
        self.duration_sum: dict[str, float] = defaultdict(float)
        self.duration_count: dict[str, int] = defaultdict(int)
        self.rejected: dict[str, int] = defaultdict(int)
        self.samples_per_s: dict[str, float] = {}
        self.samples: dict[str, int] = defaultdict(int)

    def observe(self, event: dict[str, Any]) -> None:
        kind, job = event.get("type"), str(event.get("job") or "")
        if kind == "round_committed":
            self.rounds[job] += 1
            duration = (event.get("metrics") or {}).get("duration_s")
            if isinstance(duration, (int, float)) and math.isfinite(duration):
                buckets = self.duration_buckets.setdefault(job, [0] * len(DURATION_BUCKETS))
                for i, bound in enumerate(DURATION_BUCKETS):
                    if duration <= bound:
                        buckets[i] += 1
                self.duration_sum[job] += float(duration)
                self.duration_count[job] += 1
        elif kind == "rejected":
            self.rejected[str(event.get("reason") or "other")] += 1
        elif kind == "trained":
            samples, seconds = event.get("samples"), event.get("seconds")
            if isinstance(samples, (int, float)):
                self.samples[job] += int(samples)
                if isinstance(seconds, (int, float)) and seconds > 0:
                    self.samples_per_s[job] = float(samples) / float(seconds)

    def render(self, peer_counts: dict[str, int], bytes_sent: int, bytes_received: int,
               node: dict[str, str] | None = None) -> str:
        """The text exposition format, one HELP and TYPE line per family."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str, rows: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {_num(value)}" for labels, value in rows)

        if node:
            family("gpuflex_node_info", "gauge", "This node's identity; the value is always 1.",
                   [(_labels(**node), 1)])
        family("gpuflex_peers", "gauge", "Known peers by health state.",
               [(_labels(state=s), peer_counts.get(s, 0)) for s in ("up", "suspect", "down")])
        family("gpuflex_rounds_committed_total", "counter", "Rounds this node saw committed, by job.",
               [(_labels(job=j), n) for j, n in sorted(self.rounds.items())])
        out.append("# HELP gpuflex_round_duration_seconds Wall time of committed rounds.")
        out.append("# TYPE gpuflex_round_duration_seconds histogram")
        for job in sorted(self.duration_buckets):
            buckets = self.duration_buckets[job]
            for bound, count in zip(DURATION_BUCKETS, buckets, strict=True):
                out.append(f"gpuflex_round_duration_seconds_bucket{_labels(job=job, le=_num(bound))} {count}")
            out.append(f'gpuflex_round_duration_seconds_bucket{_labels(job=job, le="+Inf")} '
                       f"{self.duration_count[job]}")
            out.append(f"gpuflex_round_duration_seconds_sum{_labels(job=job)} {_num(self.duration_sum[job])}")
            out.append(f"gpuflex_round_duration_seconds_count{_labels(job=job)} {self.duration_count[job]}")
        family("gpuflex_bytes_sent_total", "counter", "Bytes this node sent to peers.", [("", bytes_sent)])
        family("gpuflex_bytes_received_total", "counter", "Bytes this node received from peers.",
               [("", bytes_received)])
        family("gpuflex_updates_rejected_total", "counter", "Inputs from peers rejected, by reason.",
               [(_labels(reason=r), n) for r, n in sorted(self.rejected.items())])
        family("gpuflex_local_samples_per_second", "gauge", "Training throughput of this node's last round.",
               [(_labels(job=j), v) for j, v in sorted(self.samples_per_s.items())])
        family("gpuflex_local_samples_total", "counter", "Samples this node trained on, by job.",
               [(_labels(job=j), n) for j, n in sorted(self.samples.items())])
        return "\n".join(out) + "\n"


class MetricsServer:
    """Serves a node's metrics; subscribes at construction so no event is missed."""

    def __init__(self, runtime: Any, addr: str) -> None:
        self.rt = runtime
        self.host, self.port = parse_metrics_addr(addr)
        self.state = MetricsState()
        self._events = runtime.events.subscribe()
        for event in runtime.events.history():
            self.state.observe(event)
        self._seen = max((e["seq"] for e in runtime.events.history()), default=0)

    def render(self) -> str:
        mesh = self.rt.mesh
        node = {"peer_id": self.rt.identity.peer_id, "version": _version()}
        return self.state.render(mesh.peers.counts(), mesh.bytes_sent, mesh.bytes_received, node)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        bound = listeners[0].socket.getsockname()[:2]
        log.info("Prometheus metrics on http://%s:%d/metrics", bound[0], bound[1])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._consume)
            task_status.started((str(bound[0]), int(bound[1])))
            await trio.serve_listeners(self._serve, listeners)

    async def _consume(self) -> None:
        async for event in self._events:
            if event["seq"] > self._seen:
                self.state.observe(event)

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                request = await _read_head(stream)
                await stream.send_all(self._respond(request))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception as exc:  # a scraper must never take the node down
            log.warning("metrics request failed: %s", exc)
        finally:
            await stream.aclose()

    def _respond(self, request: bytes | None) -> bytes:
        parts = request.split(b"\r\n", 1)[0].split() if request else []
        if len(parts) < 2:
            return _http(400, "bad request\n")
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _http(405, "only GET\n")
        if target not in (b"/metrics", b"/"):
            return _http(404, "try /metrics\n")
        body = self.render()
        return _http(200, body, CONTENT_TYPE, head_only=method == b"HEAD")


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    buf = bytearray()
    while b"\r\n\r\n" not in buf and b"\n\n" not in buf:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            return None
    return bytes(buf)


def _http(status: int, body: str, content_type: str = "text/plain; charset=utf-8",
          head_only: bool = False) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}[status]
    data = body.encode()
    head = (f"HTTP/1.0 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    return head + (b"" if head_only else data)


def _version() -> str:
    from gpuflex import __version__

    return __version__
