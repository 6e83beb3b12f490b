"""Typed, display-ready views of the control API's JSON.

The node is a moving target that may be older or newer than the portal, so parsing is
lenient: a missing, null or mistyped field becomes ``None`` (shown as "—" or "unknown"), never
an exception. Fields other releases add (a peer's ``reachability``, per-member compute in the
ledger) are read when present. Every string from the node can come from a peer, so each is
clipped to a bound here; escaping is the templates' job (Jinja autoescape).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from gpuflex.cli.common import human_bytes as cli_bytes
from gpuflex.safetext import SHORT_ID_CHARS

MAX_TEXT = 160
"""The longest peer-supplied string the portal shows; longer ones are cut with an ellipsis."""


PeerState = Literal["up", "suspect", "down"]
PEER_STATES: tuple[PeerState, ...] = get_args(PeerState)
Reachability = Literal["public", "private", "relayed", "unknown"]
REACHABILITY: tuple[Reachability, ...] = get_args(Reachability)


def as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None  # NaN is "no value"


def count(value: Any) -> int:
    n = num(value)
    return int(n) if n is not None else 0


def text(value: Any, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        return ""
    return value if len(value) <= limit else value[: limit - 1] + "…"


def short(peer: str, n: int = SHORT_ID_CHARS) -> str:
    return "—" if not peer else (peer if len(peer) <= n + 1 else f"…{peer[-n:]}")


def human_bytes(n: float | None) -> str:
    return cli_bytes(n) if n else "—"


@dataclass(frozen=True)
class NodeInfo:
    version: str = ""
    os: str = ""
    cpu_count: int = 0
    ram_bytes: float | None = None
    accelerator: str = ""
    accelerator_memory: float | None = None
    accelerators: int = 0
    legacy: bool | None = None
    reachability: str = ""

    @classmethod
    def parse(cls, raw: Any) -> NodeInfo | None:
        if not isinstance(raw, Mapping):
            return None
        accs = [as_map(a) for a in as_list(raw.get("accelerators"))]
        legacy = raw.get("legacy")
        return cls(
            version=text(raw.get("version"), 40), os=text(raw.get("os"), 60),
            cpu_count=count(raw.get("cpu_count")), ram_bytes=num(raw.get("ram_bytes")),
            accelerator=text(accs[0].get("name"), 60) if accs else "",
            accelerator_memory=num(accs[0].get("memory_bytes")) if accs else None,
            accelerators=len(accs), legacy=legacy if isinstance(legacy, bool) else None,
            reachability=text(raw.get("reachability"), 20))

    @property
    def device(self) -> str:
        if self.accelerator:
            more = f" +{self.accelerators - 1}" if self.accelerators > 1 else ""
            return f"{self.accelerator}{more}"
        return f"CPU ×{self.cpu_count}" if self.cpu_count else "CPU"

    @property
    def memory(self) -> str:
        return human_bytes(self.accelerator_memory if self.accelerator else self.ram_bytes)


def reachability_of(*sources: Any) -> Reachability:
    """The first known reachability among the row and its NodeInfo; "unknown" when none says."""
    for raw in sources:
        for value in REACHABILITY:
            if raw == value:
                return value
    return "unknown"


@dataclass(frozen=True)
class Peer:
    peer_id: str
    state: PeerState = "down"
    rtt_ms: float | None = None
    last_seen: float | None = None
    info: NodeInfo | None = None
    reachability: Reachability = "unknown"
    rounds: int = 0
    penalty: float = 0.0

    @classmethod
    def parse(cls, raw: Any) -> Peer:
        d = as_map(raw)
        state: PeerState = next((s for s in PEER_STATES if s == d.get("state")), "down")
        info_raw = as_map(d.get("info"))
        return cls(
            peer_id=text(d.get("peer_id"), 80) or "?",
            state=state,
            rtt_ms=num(d.get("rtt_ms")), last_seen=num(d.get("last_seen")),
            info=NodeInfo.parse(d.get("info")),
            reachability=reachability_of(d.get("reachability"), info_raw.get("reachability")),
            rounds=count(d.get("rounds_contributed")), penalty=num(d.get("penalty")) or 0.0)

    @property
    def device(self) -> str:
        return self.info.device if self.info else "—"

    @property
    def memory(self) -> str:
        return self.info.memory if self.info else "—"

    @property
    def legacy(self) -> bool | None:
        return self.info.legacy if self.info else None


@dataclass(frozen=True)
class Point:
    round: int
    loss: float | None = None
    accuracy: float | None = None
    perplexity: float | None = None  # a language model's rounds
    sent_bytes: float | None = None  # what the round's updates weighed, all members (``update_bytes``)

    @classmethod
    def parse(cls, raw: Any) -> Point:
        m = as_map(raw)
        return cls(count(m.get("round")), num(m.get("loss")), num(m.get("accuracy")), num(m.get("perplexity")),
                   num(m.get("update_bytes")))


@dataclass(frozen=True)
class Job:
    job_id: str
    name: str = ""
    state: str = "pending"
    round: int = 0
    rounds: int = 0
    phase: str = "idle"
    phase_progress: float = 0.0
    coordinator: str = ""
    is_coordinator: bool = False
    role: str = "idle"
    members: tuple[str, ...] = ()
    metrics: tuple[Point, ...] = ()
    waiting: str = ""
    error: str = ""
    model_hash: str = ""
    spec: Mapping[str, Any] | None = None
    kind: str = ""  # "inference" for a batch inference job (answers for rounds, no ledger)

    @classmethod
    def parse(cls, raw: Any) -> Job:
        d = as_map(raw)
        spec = d.get("spec")
        return cls(
            job_id=text(d.get("job_id"), 80) or "?", name=text(d.get("name"), 80),
            state=text(d.get("state"), 20) or "pending", round=count(d.get("round")),
            rounds=count(d.get("rounds")), phase=text(d.get("phase"), 20) or "idle",
            phase_progress=min(1.0, max(0.0, num(d.get("phase_progress")) or 0.0)),
            coordinator=text(d.get("coordinator"), 80), is_coordinator=d.get("is_coordinator") is True,
            role=text(d.get("role"), 20) or "idle",
            members=tuple(text(m, 80) for m in as_list(d.get("members"))[:1000]),
            metrics=tuple(Point.parse(m) for m in as_list(d.get("metrics"))),
            waiting=text(d.get("waiting"), 300), error=text(d.get("error"), 300),
            model_hash=text(d.get("model_hash"), 80),
            spec=spec if isinstance(spec, Mapping) else None, kind=text(d.get("kind"), 20))

    @property
    def label(self) -> str:
        return self.name or self.job_id

    @property
    def progress(self) -> float:
        """Rounds done, with the round in flight counted by phase, as a fraction of the job."""
        if self.state == "done":
            return 1.0
        if not self.rounds:
            return 0.0
        phases = ("plan", "train", "reduce", "commit")
        inflight = (phases.index(self.phase) + self.phase_progress) / 4 if self.phase in phases else 0.0
        return min(1.0, (self.round + inflight) / self.rounds)


@dataclass(frozen=True)
class Contribution:
    peer: str
    samples: int
    seconds: float | None = None
    share: float | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


MEMBER_FIELDS = {"device": "device", "steps": "local steps", "samples_per_s": "samples/s"}
"""Per-member figures a ledger row's contributors carry beside peer and samples (the node's
``ledger`` rows: each member's device, local steps and samples per second, with ``compute_s``
and ``compute_share`` read into ``seconds`` and ``share``), each with the label a page shows;
shown when present."""


def member_figure(value: Any) -> str:
    """A member's figure as a page shows it: numbers rounded for people, text clipped."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return text(str(value), 60)
    return f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.3g}"


@dataclass(frozen=True)
class LedgerRound:
    round: int
    coordinator: str = ""
    contributors: tuple[Contribution, ...] = ()
    absent: tuple[str, ...] = ()
    loss: float | None = None
    accuracy: float | None = None
    model_hash: str = ""
    result_hash: str = ""
    perplexity: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> LedgerRound:
        d = as_map(raw)
        metrics = as_map(d.get("metrics"))
        members = _member_metrics(metrics.get("members"))
        contributors = []
        for c in as_list(d.get("contributors"))[:1000]:
            c = as_map(c)
            peer = text(c.get("peer"), 80) or "?"
            more = {**members.get(peer, {}), **c}
            seconds = num(more.get("compute_s", more.get("seconds")))
            share = num(more.get("compute_share"))
            extra = {label: member_figure(more[k]) for k, label in MEMBER_FIELDS.items() if more.get(k) is not None}
            contributors.append(Contribution(peer, count(c.get("samples")), seconds, share, extra))
        return cls(
            round=count(d.get("round")), coordinator=text(d.get("coordinator"), 80),
            contributors=tuple(contributors),
            absent=tuple(text(p, 80) for p in as_list(d.get("absent"))[:1000]),
            loss=num(metrics.get("loss")), accuracy=num(metrics.get("accuracy")),
            model_hash=text(d.get("model_hash"), 80), result_hash=text(d.get("result_hash"), 80),
            perplexity=num(metrics.get("perplexity")))


def _member_metrics(raw: Any) -> dict[str, Mapping[str, Any]]:
    """Per-member figures inside a round's metrics, as ``{peer: {...}}`` or ``[{peer, ...}]``."""
    if isinstance(raw, Mapping):
        return {str(k): as_map(v) for k, v in raw.items()}
    return {text(as_map(m).get("peer"), 80): as_map(m) for m in as_list(raw)}


@dataclass(frozen=True)
class Mesh:
    """The peers this node knows, and how many of them are in each state."""

    peers: int = 0
    by_state: Mapping[str, int] = field(default_factory=dict)

    def count(self, state: PeerState) -> int:
        return self.by_state.get(state, 0)


@dataclass(frozen=True)
class Status:
    peer_id: str = ""
    version: str = ""
    home: str = ""
    addrs: tuple[str, ...] = ()
    uptime_s: float | None = None
    mesh: Mesh = field(default_factory=Mesh)
    info: NodeInfo | None = None
    reachability: Reachability = "unknown"

    @classmethod
    def parse(cls, raw: Any) -> Status:
        d = as_map(raw)
        m = as_map(d.get("mesh"))
        info = as_map(d.get("node_info"))
        return cls(
            peer_id=text(d.get("peer_id"), 80), version=text(d.get("version"), 40),
            home=text(d.get("home"), 300),
            addrs=tuple(text(a, 300) for a in as_list(d.get("addrs"))[:32]),
            uptime_s=num(d.get("uptime_s")),
            mesh=Mesh(count(m.get("peers")), {s: count(m.get(s)) for s in PEER_STATES}),
            info=NodeInfo.parse(d.get("node_info")),
            reachability=reachability_of(d.get("reachability"), info.get("reachability")))


@dataclass(frozen=True)
class Event:
    seq: int
    ts: float | None
    type: str
    message: str = ""
    job: str = ""
    peer: str = ""

    @classmethod
    def parse(cls, raw: Any) -> Event:
        d = as_map(raw)
        return cls(count(d.get("seq")), num(d.get("ts")), text(d.get("type"), 40) or "event",
                   text(d.get("message"), 300), text(d.get("job"), 80), text(d.get("peer"), 80))
