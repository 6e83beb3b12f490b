"""Typed view of a node's serving (the ``serve`` block of ``status``, docs/control-api.md):
each server of the mesh with its models, load, requests and tokens per second and latency;
the models this node serves itself; and its batch inference runs. The dashboard and the
portal both draw from it (they are control-API clients: this module imports nothing of the
node and no torch).

Parsed leniently: a node without serving, or an older or newer one, gives an empty or partial
view, and a figure that is not a number is None (shown as a dash), never an exception."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


@dataclass(frozen=True)
class Figures:
    """What a server announces of itself: rates over the last minute, medians in ms."""

    rps: float | None = None
    tokens_per_s: float | None = None
    ttft_ms: float | None = None
    latency_ms: float | None = None

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> Figures:
        return cls(_num(d.get("rps")), _num(d.get("tokens_per_s")), _num(d.get("ttft_ms_p50")),
                   _num(d.get("latency_ms_p50")))


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
        d = _map(raw)
        return cls(_str(d.get("peer"), "?"), bool(d.get("self", False)),
                   tuple(_str(m) for m in as_list(d.get("models"))), _int(d.get("load")), _int(d.get("capacity")),
                   _num(d.get("rtt_ms")), Figures.parse(d))


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

    @classmethod
    def parse(cls, raw: Any) -> ServedModel:
        d = _map(raw)
        return cls(_str(d.get("name"), "?"), _str(d.get("source")), _str(d.get("hash")), _int(d.get("load")),
                   _int(d.get("capacity")), _int(d.get("requests")), _int(d.get("tokens")), _int(d.get("errors")),
                   Figures.parse(d))


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
        d = _map(raw)
        return cls(_str(d.get("run_id"), "?"), _str(d.get("name")), _str(d.get("model")),
                   _str(d.get("state"), "running"), _int(d.get("done")), _int(d.get("total")), _str(d.get("error")))


@dataclass(frozen=True)
class Serving:
    api: str = ""
    servers: tuple[Server, ...] = ()
    models: tuple[ServedModel, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    runs: tuple[InferenceRun, ...] = ()
    taken_in: Figures = Figures()

    @classmethod
    def from_status(cls, status: Any) -> Serving:
        d = _map(_map(status).get("serve"))
        return cls(
            api=_str(d.get("http")),
            servers=tuple(Server.parse(s) for s in as_list(d.get("servers"))),
            models=tuple(ServedModel.parse(m) for m in as_list(d.get("models"))),
            failed=tuple((_str(k), _str(v)) for k, v in _map(d.get("failed")).items()),
            runs=tuple(InferenceRun.parse(r) for r in as_list(d.get("runs"))),
            taken_in=Figures.parse(_map(d.get("taken_in"))),
        )

    @property
    def empty(self) -> bool:
        return not (self.api or self.servers or self.models or self.failed or self.runs)
