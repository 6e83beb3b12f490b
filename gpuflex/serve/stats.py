"""What a serving node reports of itself: requests and tokens per second over the last
minute, time to first token and request latency (medians of the last few hundred)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any

WINDOW_S = 60.0
SAMPLES = 256


class ServeStats:
    def __init__(self) -> None:
        self.requests_total = 0
        self.tokens_total = 0
        self.errors_total = 0
        self._done: deque[float] = deque()  # finish times within the window
        self._toks: deque[tuple[float, int]] = deque()
        self._ttft: deque[float] = deque(maxlen=SAMPLES)
        self._latency: deque[float] = deque(maxlen=SAMPLES)

    def _trim(self, now: float) -> None:
        while self._done and self._done[0] < now - WINDOW_S:
            self._done.popleft()
        while self._toks and self._toks[0][0] < now - WINDOW_S:
            self._toks.popleft()

    def first_token(self, seconds: float) -> None:
        self._ttft.append(seconds)

    def tokens(self, count: int) -> None:
        now = time.monotonic()
        self.tokens_total += count
        if self._toks and self._toks[-1][0] > now - 1.0:
            self._toks[-1] = (self._toks[-1][0], self._toks[-1][1] + count)
        else:
            self._toks.append((now, count))
        self._trim(now)

    def finished(self, seconds: float) -> None:
        now = time.monotonic()
        self.requests_total += 1
        self._done.append(now)
        self._latency.append(seconds)
        self._trim(now)

    def failed(self) -> None:
        self.errors_total += 1

    @staticmethod
    def _median_ms(xs: deque[float]) -> float | None:
        return round(statistics.median(xs) * 1000, 1) if xs else None

    def row(self) -> dict[str, Any]:
        now = time.monotonic()
        self._trim(now)
        return {"requests": self.requests_total, "tokens": self.tokens_total, "errors": self.errors_total,
                "rps": round(len(self._done) / WINDOW_S, 3),
                "tokens_per_s": round(sum(n for _, n in self._toks) / WINDOW_S, 2),
                "ttft_ms_p50": self._median_ms(self._ttft), "latency_ms_p50": self._median_ms(self._latency)}


def node_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One node's figures over all its models (each a ``ServeStats.row``): rates add up; the
    medians are weighted by each model's requests (a rough pooled median, for a status line)."""
    out: dict[str, Any] = {"rps": round(sum(r["rps"] for r in rows), 3),
                           "tokens_per_s": round(sum(r["tokens_per_s"] for r in rows), 2)}
    for key in ("ttft_ms_p50", "latency_ms_p50"):
        weighted = [(r[key], max(1, r["requests"])) for r in rows if r.get(key) is not None]
        total = sum(w for _, w in weighted)
        out[key] = round(sum(v * w for v, w in weighted) / total, 1) if weighted else None
    return out
