"""The one typed view of the control API's JSON (docs/control-api.md): status, peers, jobs,
ledger rounds and events, as the dashboard and the portal both draw them.

The node is a moving target that may be older or newer than its client, so parsing is
lenient: a missing, null or mistyped field becomes a default (``""``, ``0`` or ``None``), never
an exception, and a number that is not finite counts as absent. Fields other releases add (a
peer's ``reachability``, per-member compute in the ledger) are read when present.

Every string here may come from a peer, so every string goes through one rule, :func:`clip`:
not a string reads as ``""``, and a string is cut to the bound of its kind (a word, a name or
id, a line of text) with an ellipsis; lists are bounded likewise. Making text inert is each
view's own job, because it depends on the medium: the dashboard escapes control characters
and markup (``tui.format.literal``), the portal's templates escape HTML (Jinja autoescape).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

WORD = 40
"""A state, phase, role, kind or version."""
NAME = 80
"""A peer or job id, a name, a hash, a device or an operating system."""
LINE = 300
"""A sentence: a message, a reason, a path, an address."""
MAX_TEXT = LINE
"""The longest string any view of the model holds."""
MAX_ITEMS = 1000
"""The most members, contributors or absentees a row keeps."""
MAX_ADDRS = 32
"""The most addresses a peer or a node keeps."""

PHASES = ("plan", "train", "reduce", "commit")
"""The phases of a round in flight, in order."""
PeerState = Literal["up", "suspect", "down"]
PEER_STATES: tuple[PeerState, ...] = get_args(PeerState)
Reachability = Literal["public", "private", "relayed", "unknown"]
REACHABILITY: tuple[Reachability, ...] = get_args(Reachability)
Link = Literal["direct", "relayed", "none"]
"""How this node reaches a peer."""
LINKS: tuple[Link, ...] = get_args(Link)


def clip(value: Any, bound: int = LINE) -> str:
    """The one rule for untrusted text: a string cut to ``bound`` characters (the last one an
    ellipsis), and anything that is not a string as ``""``."""
    if not isinstance(value, str):
        return ""
    return value if len(value) <= bound else value[: bound - 1] + "…"


def as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    """A JSON array, or nothing: a wrong type from the node must not break a view."""
    return value if isinstance(value, list) else []


def number(value: Any) -> float | None:
    """A finite JSON number; booleans, NaN and infinities are "no value"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def count(value: Any) -> int:
    """A whole number, 0 when absent or not a number."""
    n = number(value)
    return int(n) if n is not None else 0


def maybe_count(value: Any) -> int | None:
    """A whole number, or None when absent or not a number."""
    n = number(value)
    return int(n) if n is not None else None


def _names(value: Any, bound: int = NAME, most: int = MAX_ITEMS) -> tuple[str, ...]:
    return tuple(clip(v, bound) for v in as_list(value)[:most])


def _choice(value: Any, choices: tuple[str, ...], default: str) -> Any:
    return next((c for c in choices if c == value), default)


def reachability_of(*sources: Any) -> Reachability:
    """The first known reachability among the values; "unknown" when none says."""
    return next((r for raw in sources for r in REACHABILITY if r == raw and r != "unknown"), "unknown")


@dataclass(frozen=True)
class Accelerator:
    kind: str
    name: str
    memory_bytes: int | None
    capability: str

    @classmethod
    def parse(cls, raw: Any) -> Accelerator:
        d = as_map(raw)
        return cls(clip(d.get("kind"), WORD), clip(d.get("name"), NAME) or "?",
                   maybe_count(d.get("memory_bytes")), clip(d.get("capability"), WORD))


@dataclass(frozen=True)
class NodeInfo:
    """What a node publishes about itself (its NodeInfo record)."""

    peer_id: str = ""
    version: str = ""
    os: str = ""
    cpu_count: int = 0
    ram_bytes: int | None = None
    torch: str = ""
    legacy: bool | None = None
    accelerators: tuple[Accelerator, ...] = ()
    addrs: tuple[str, ...] = ()
    ts: float | None = None
    reachability: Reachability = "unknown"

    @classmethod
    def parse(cls, raw: Any) -> NodeInfo | None:
        if not isinstance(raw, Mapping):
            return None
        legacy = raw.get("legacy")
        return cls(
            peer_id=clip(raw.get("peer_id"), NAME), version=clip(raw.get("version"), WORD),
            os=clip(raw.get("os"), NAME), cpu_count=count(raw.get("cpu_count")),
            ram_bytes=maybe_count(raw.get("ram_bytes")), torch=clip(raw.get("torch"), WORD),
            legacy=legacy if isinstance(legacy, bool) else None,
            accelerators=tuple(Accelerator.parse(a) for a in as_list(raw.get("accelerators"))[:64]),
            addrs=_names(raw.get("addrs"), LINE, MAX_ADDRS), ts=number(raw.get("ts")),
            reachability=reachability_of(raw.get("reachability")))

    @property
    def accelerator(self) -> str:
        """The first accelerator's name, or "" for a CPU-only node."""
        return self.accelerators[0].name if self.accelerators else ""

    @property
    def memory_bytes(self) -> int | None:
        """The first accelerator's memory, or the RAM of a CPU-only node."""
        return self.accelerators[0].memory_bytes if self.accelerators else self.ram_bytes

    @property
    def device(self) -> str:
        """The device in words: the first accelerator ("+N" more), or the CPU and its cores."""
        if self.accelerators:
            more = f" +{len(self.accelerators) - 1}" if len(self.accelerators) > 1 else ""
            return f"{self.accelerator}{more}"
        return f"CPU ×{self.cpu_count}" if self.cpu_count else "CPU"


@dataclass(frozen=True)
class Peer:
    peer_id: str
    state: PeerState = "down"
    rtt_ms: float | None = None
    last_seen: float | None = None
    addrs: tuple[str, ...] = ()
    info: NodeInfo | None = None
    rounds_contributed: int = 0
    penalty: float = 0.0
    reachability: Reachability = "unknown"  # the row's, else its own NodeInfo's
    connection: Link = "none"  # this node's link to it

    @classmethod
    def parse(cls, raw: Any) -> Peer:
        d = as_map(raw)
        info = NodeInfo.parse(d.get("info"))
        return cls(
            peer_id=clip(d.get("peer_id"), NAME) or "?",
            state=_choice(d.get("state"), PEER_STATES, "down"),
            rtt_ms=number(d.get("rtt_ms")), last_seen=number(d.get("last_seen")),
            addrs=_names(d.get("addrs"), LINE, MAX_ADDRS), info=info,
            rounds_contributed=count(d.get("rounds_contributed")),
            penalty=number(d.get("penalty")) or 0.0,
            reachability=reachability_of(d.get("reachability"), info.reachability if info else None),
            connection=_choice(d.get("connection"), LINKS, "none"))

    @property
    def device(self) -> str:
        return self.info.device if self.info else "—"

    @property
    def memory_bytes(self) -> int | None:
        return self.info.memory_bytes if self.info else None

    @property
    def legacy(self) -> bool | None:
        return self.info.legacy if self.info else None


@dataclass(frozen=True)
class RoundMetrics:
    """One committed round's figures (a job's ``metrics`` row, or a ledger row's)."""

    round: int
    loss: float | None = None
    accuracy: float | None = None
    contributors: int | None = None
    duration_s: float | None = None
    perplexity: float | None = None  # a language model's rounds
    sent_bytes: float | None = None  # what the round's updates weighed, all members (``update_bytes``)

    @classmethod
    def parse(cls, raw: Any) -> RoundMetrics:
        d = as_map(raw)
        return cls(count(d.get("round")), number(d.get("loss")), number(d.get("accuracy")),
                   maybe_count(d.get("contributors")), number(d.get("duration_s")),
                   number(d.get("perplexity")), number(d.get("update_bytes")))


@dataclass(frozen=True)
class MemberWork:
    """One member's work in a job's last committed round (the JobSummary's ``work``)."""

    peer: str
    device: str = ""
    steps: int | None = None
    samples_per_s: float | None = None
    compute_s: float | None = None
    compute_share: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> MemberWork:
        d = as_map(raw)
        return cls(peer=clip(d.get("peer"), NAME) or "?", device=clip(d.get("device"), NAME),
                   steps=maybe_count(d.get("steps")), samples_per_s=number(d.get("samples_per_s")),
                   compute_s=number(d.get("compute_s")), compute_share=number(d.get("compute_share")))


@dataclass(frozen=True)
class GoneMember:
    """A member whose presence says the job failed there, and why, in that peer's own words
    (a row of the JobSummary's ``gone``): plans leave it out, so a view names it rather than
    leave a person to wonder why its updates never come."""

    peer: str
    reason: str = ""

    @classmethod
    def parse(cls, raw: Any) -> GoneMember | None:
        """None for a row that names no peer: there is nobody to show, so the view skips it.
        A missing or mistyped reason reads as ``""``, as any other field would."""
        d = as_map(raw)
        peer = clip(d.get("peer"), NAME)
        return cls(peer, clip(d.get("reason"))) if peer else None


def _gone(value: Any) -> tuple[GoneMember, ...]:
    """The ``gone`` rows that name a peer, at most ``MAX_ITEMS``."""
    rows = (GoneMember.parse(r) for r in as_list(value)[:MAX_ITEMS])
    return tuple(row for row in rows if row is not None)


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
    metrics: tuple[RoundMetrics, ...] = ()
    waiting: str = ""  # why a running job cannot commit here
    stalled: str = ""  # why the round in flight has not committed yet
    error: str = ""
    model_hash: str = ""
    spec: Mapping[str, Any] | None = None
    work: tuple[MemberWork, ...] = ()  # each member's work in the last committed round
    kind: str = ""  # "inference" for a batch inference job (answers for rounds, no ledger)
    gone: tuple[GoneMember, ...] = ()  # members whose job failed there, with their reasons

    @classmethod
    def parse(cls, raw: Any) -> Job:
        d = as_map(raw)
        spec = d.get("spec")
        return cls(
            job_id=clip(d.get("job_id"), NAME) or "?", name=clip(d.get("name"), NAME),
            state=clip(d.get("state"), WORD) or "pending", round=count(d.get("round")),
            rounds=count(d.get("rounds")), phase=clip(d.get("phase"), WORD) or "idle",
            phase_progress=min(1.0, max(0.0, number(d.get("phase_progress")) or 0.0)),
            coordinator=clip(d.get("coordinator"), NAME), is_coordinator=d.get("is_coordinator") is True,
            role=clip(d.get("role"), WORD) or "idle", members=_names(d.get("members")),
            metrics=tuple(RoundMetrics.parse(m) for m in as_list(d.get("metrics"))),
            waiting=clip(d.get("waiting")), stalled=clip(d.get("stalled")), error=clip(d.get("error")),
            model_hash=clip(d.get("model_hash"), NAME), spec=spec if isinstance(spec, Mapping) else None,
            work=tuple(MemberWork.parse(w) for w in as_list(d.get("work"))[:MAX_ITEMS]),
            kind=clip(d.get("kind"), WORD), gone=_gone(d.get("gone")))

    @property
    def label(self) -> str:
        return self.name or self.job_id

    @property
    def stall(self) -> str:
        """Why the round in flight cannot commit, if anything says so."""
        return self.waiting or self.stalled

    def round_progress(self) -> float:
        """Progress through the round in flight, counting each of the four phases as a
        quarter, so a bar moves steadily instead of refilling once per phase."""
        if self.state == "done" or self.phase == "done":
            return 1.0
        if self.phase not in PHASES:
            return 0.0
        return (PHASES.index(self.phase) + self.phase_progress) / len(PHASES)

    @property
    def progress(self) -> float:
        """Rounds done, with the round in flight counted by phase, as a fraction of the job."""
        if self.state == "done":
            return 1.0
        if not self.rounds:
            return 0.0
        inflight = self.round_progress() if self.phase in PHASES else 0.0
        return min(1.0, (self.round + inflight) / self.rounds)


MEMBER_FIELDS = {"device": "device", "steps": "local steps", "samples_per_s": "samples/s"}
"""Per-member figures a ledger row's contributors carry beside peer and samples (each member's
device, local steps and samples per second, with ``compute_s`` and ``compute_share`` read into
``seconds`` and ``share``), each with the label a view shows; read when present."""


def member_figure(value: Any) -> str:
    """A member's figure as people read it: numbers rounded, text clipped."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return clip(str(value), NAME)
    return f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.3g}"


@dataclass(frozen=True)
class Contribution:
    peer: str
    samples: int
    seconds: float | None = None
    share: float | None = None
    extra: Mapping[str, str] = field(default_factory=dict)  # MEMBER_FIELDS' labels: figures


@dataclass(frozen=True)
class LedgerRound:
    round: int
    coordinator: str = ""
    contributors: tuple[Contribution, ...] = ()
    absent: tuple[str, ...] = ()
    metrics: RoundMetrics | None = None
    model_hash: str = ""
    prev_result_hash: str = ""
    result_hash: str = ""

    @classmethod
    def parse(cls, raw: Any) -> LedgerRound:
        d = as_map(raw)
        metrics = as_map(d.get("metrics"))
        members = _member_metrics(metrics.get("members"))
        contributors = []
        for c in as_list(d.get("contributors"))[:MAX_ITEMS]:
            c = as_map(c)
            peer = clip(c.get("peer"), NAME) or "?"
            more = {**members.get(peer, {}), **c}
            extra = {label: member_figure(more[k]) for k, label in MEMBER_FIELDS.items()
                     if more.get(k) is not None}
            contributors.append(Contribution(
                peer, count(c.get("samples")), number(more.get("compute_s", more.get("seconds"))),
                number(more.get("compute_share")), extra))
        return cls(
            round=count(d.get("round")), coordinator=clip(d.get("coordinator"), NAME),
            contributors=tuple(contributors), absent=_names(d.get("absent")),
            metrics=RoundMetrics.parse({"round": d.get("round"), **metrics}) if metrics else None,
            model_hash=clip(d.get("model_hash"), NAME),
            prev_result_hash=clip(d.get("prev_result_hash"), NAME),
            result_hash=clip(d.get("result_hash"), NAME))

    @property
    def loss(self) -> float | None:
        return self.metrics.loss if self.metrics else None

    @property
    def accuracy(self) -> float | None:
        return self.metrics.accuracy if self.metrics else None

    @property
    def perplexity(self) -> float | None:
        return self.metrics.perplexity if self.metrics else None


def _member_metrics(raw: Any) -> dict[str, Mapping[str, Any]]:
    """Per-member figures inside a round's metrics, as ``{peer: {...}}`` or ``[{peer, ...}]``."""
    if isinstance(raw, Mapping):
        return {clip(k, NAME): as_map(v) for k, v in list(raw.items())[:MAX_ITEMS]}
    return {clip(as_map(m).get("peer"), NAME): as_map(m) for m in as_list(raw)[:MAX_ITEMS]}


@dataclass(frozen=True)
class Mesh:
    """The peers this node knows, and how many of them are in each state."""

    peers: int = 0
    up: int = 0
    suspect: int = 0
    down: int = 0

    def count(self, state: PeerState) -> int:
        return {"up": self.up, "suspect": self.suspect, "down": self.down}.get(state, 0)


@dataclass(frozen=True)
class Status:
    peer_id: str = ""
    version: str = ""
    home: str = ""
    addrs: tuple[str, ...] = ()
    uptime_s: float | None = None
    mesh: Mesh = field(default_factory=Mesh)
    node_info: NodeInfo | None = None
    reachability: Reachability = "unknown"

    @classmethod
    def parse(cls, raw: Any) -> Status:
        d = as_map(raw)
        m = as_map(d.get("mesh"))
        info = NodeInfo.parse(d.get("node_info"))
        return cls(
            peer_id=clip(d.get("peer_id"), NAME), version=clip(d.get("version"), WORD),
            home=clip(d.get("home")), addrs=_names(d.get("addrs"), LINE, MAX_ADDRS),
            uptime_s=number(d.get("uptime_s")),
            mesh=Mesh(count(m.get("peers")), count(m.get("up")), count(m.get("suspect")), count(m.get("down"))),
            node_info=info,
            reachability=reachability_of(d.get("reachability"), info.reachability if info else None))


@dataclass(frozen=True)
class Event:
    seq: int
    ts: float | None
    type: str
    message: str = ""
    job: str = ""
    round: int | None = None
    peer: str = ""

    @classmethod
    def parse(cls, raw: Any) -> Event:
        d = as_map(raw)
        return cls(count(d.get("seq")), number(d.get("ts")), clip(d.get("type"), WORD) or "event",
                   clip(d.get("message")), clip(d.get("job"), NAME), maybe_count(d.get("round")),
                   clip(d.get("peer"), NAME))
