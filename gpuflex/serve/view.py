"""Typed view of a node's serving (the ``serve`` block of ``status``, docs/control-api.md):
each server of the mesh with its models, load, requests and tokens per second and latency;
the models this node serves itself, with how each is fitted to the device; its batch inference
runs; and, per peer, the tokens it served for this node's callers and the redundancy checks'
mismatches and penalties (the credit views show these beside training credit). The dashboard
and the portal both draw from it (they are control-API clients: this module imports nothing
of the node and no torch).

Parsed leniently with the clients' own rules (``gpuflex.client.model``): a node without serving,
or an older or newer one, gives an empty or partial view, a figure that is not a finite number
is None (shown as a dash), never an exception, and text is clipped like every other view's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuflex.client.model import LINE, MAX_ITEMS, NAME, WORD, as_list, as_map, clip, count, number


def _str(value: Any, bound: int = NAME, default: str = "") -> str:
    """Untrusted text under the clients' one clipping rule (``gpuflex.client.model.clip``)."""
    return clip(value, bound) or default


def _items(value: Any) -> list[Any]:
    return as_list(value)[:MAX_ITEMS]


@dataclass(frozen=True)
class Figures:
    """What a server announces of itself: rates over the last minute, medians in ms."""

    rps: float | None = None
    tokens_per_s: float | None = None
    ttft_ms: float | None = None
    latency_ms: float | None = None

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> Figures:
        return cls(number(d.get("rps")), number(d.get("tokens_per_s")), number(d.get("ttft_ms_p50")),
                   number(d.get("latency_ms_p50")))


@dataclass(frozen=True)
class Server:
    """One node serving models, as this node hears it (its own row is marked ``is_self``)."""

    peer: str
    is_self: bool = False
    models: tuple[str, ...] = ()
    load: int = 0
    capacity: int = 0
    rtt_ms: float | None = None
    figures: Figures = Figures()

    @classmethod
    def parse(cls, raw: Any) -> Server:
        d = as_map(raw)
        return cls(_str(d.get("peer"), NAME, "?"), bool(d.get("self", False)),
                   tuple(_str(m) for m in _items(d.get("models"))), count(d.get("load")), count(d.get("capacity")),
                   number(d.get("rtt_ms")), Figures.parse(d))


@dataclass(frozen=True)
class Fit:
    """How a served model is fitted to this node's device (``gpuflex.serve.fit``)."""

    device: str = ""
    dtype: str = ""
    batch: int = 0
    asked_batch: int = 0
    memory_mb: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> Fit:
        d = as_map(raw)
        return cls(_str(d.get("device"), WORD), _str(d.get("dtype"), WORD), count(d.get("batch")),
                   count(d.get("asked_batch")), number(d.get("memory_mb")))

    @property
    def text(self) -> str:
        """``cuda:0 bfloat16, batch 8, KV 512 MiB`` (the asked batch too, where the device holds less)."""
        if not self.device:
            return ""
        batch = f"batch {self.batch}" + (f" of {self.asked_batch}" if self.asked_batch > self.batch else "")
        memory = "" if self.memory_mb is None else f", KV {self.memory_mb:.0f} MiB"
        return f"{self.device} {self.dtype}, {batch}{memory}"


@dataclass(frozen=True)
class ServedModel:
    """A model this node serves itself, with its own counters."""

    name: str
    source: str = ""
    model_hash: str = ""
    load: int = 0
    capacity: int = 0
    requests: int = 0
    tokens: int = 0
    errors: int = 0
    figures: Figures = Figures()
    fit: Fit = Fit()

    @classmethod
    def parse(cls, raw: Any) -> ServedModel:
        d = as_map(raw)
        return cls(_str(d.get("name"), NAME, "?"), _str(d.get("source"), LINE), _str(d.get("hash")),
                   count(d.get("load")),
                   count(d.get("capacity")), count(d.get("requests")), count(d.get("tokens")), count(d.get("errors")),
                   Figures.parse(d), Fit.parse(d.get("fit")))


@dataclass(frozen=True)
class PeerServing:
    """One peer's serving credit as this node counts it: the tokens it made for this node's
    callers, and the redundancy checks' mismatches it was part of and penalties it took."""

    peer: str
    tokens: int = 0
    mismatches: int = 0
    penalised: int = 0


def _peer_counts(d: Any) -> dict[str, int]:
    return {_str(k, NAME, "?"): max(0, count(v)) for k, v in list(as_map(d).items())[:MAX_ITEMS]}


def peer_serving(serve: Mapping[str, Any]) -> tuple[PeerServing, ...]:
    """Every peer with served tokens, a mismatch or a penalty; most tokens first."""
    tokens = _peer_counts(serve.get("served_tokens"))
    checks = as_map(serve.get("redundancy"))
    mismatches, penalised = _peer_counts(checks.get("mismatches")), _peer_counts(checks.get("penalised"))
    peers = sorted(set(tokens) | set(mismatches) | set(penalised), key=lambda p: (-tokens.get(p, 0), p))
    return tuple(PeerServing(p, tokens.get(p, 0), mismatches.get(p, 0), penalised.get(p, 0))
                 for p in peers[:MAX_ITEMS])


@dataclass(frozen=True)
class InferenceRun:
    """A batch inference job this node runs: answers collected of prompts given."""

    run_id: str
    name: str = ""
    model: str = ""
    state: str = "running"
    done: int = 0
    total: int = 0
    error: str = ""

    @classmethod
    def parse(cls, raw: Any) -> InferenceRun:
        d = as_map(raw)
        return cls(_str(d.get("run_id"), NAME, "?"), _str(d.get("name")), _str(d.get("model")),
                   _str(d.get("state"), WORD, "running"), count(d.get("done")), count(d.get("total")),
                   _str(d.get("error"), LINE))


@dataclass(frozen=True)
class Serving:
    api: str = ""
    servers: tuple[Server, ...] = ()
    models: tuple[ServedModel, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    runs: tuple[InferenceRun, ...] = ()
    taken_in: Figures = Figures()
    credit: tuple[PeerServing, ...] = ()
    reports: tuple[str, ...] = ()  # the redundancy checks' latest mismatches, one line each

    @classmethod
    def from_status(cls, status: Any) -> Serving:
        d = as_map(as_map(status).get("serve"))
        return cls(
            api=_str(d.get("http"), LINE),
            servers=tuple(Server.parse(s) for s in _items(d.get("servers"))),
            models=tuple(ServedModel.parse(m) for m in _items(d.get("models"))),
            failed=tuple((_str(k), _str(v, LINE)) for k, v in list(as_map(d.get("failed")).items())[:MAX_ITEMS]),
            runs=tuple(InferenceRun.parse(r) for r in _items(d.get("runs"))),
            taken_in=Figures.parse(as_map(d.get("taken_in"))),
            credit=peer_serving(d),
            reports=tuple(_str(r, LINE) for r in _items(as_map(d.get("redundancy")).get("reports"))),
        )

    def credit_of(self, peer: str) -> PeerServing | None:
        """``peer``'s serving credit, None when it served nothing here and was never checked."""
        return next((c for c in self.credit if c.peer == peer), None)

    @property
    def empty(self) -> bool:
        return not (self.api or self.servers or self.models or self.failed or self.runs)
