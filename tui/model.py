"""Typed views of the control API's JSON (docs/control-api.md).

The node is another team's moving target and may be older or newer than the dashboard, so
parsing is lenient: a missing or null field becomes a default instead of an exception, and
the screens only ever see these types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tui import format as fmt

PHASES = ("plan", "train", "reduce", "commit")


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    """A JSON array, or nothing: a wrong type from the node must not break a screen."""
    return value if isinstance(value, list) else []


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any, default: int = 0) -> int:
    return (
        int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
    )


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


@dataclass(frozen=True)
class Accelerator:
    kind: str
    name: str
    memory_bytes: int | None
    capability: str

    @classmethod
    def parse(cls, raw: Any) -> Accelerator:
        d = _map(raw)
        mem = _float(d.get("memory_bytes"))
        return cls(
            _str(d.get("kind")),
            _str(d.get("name"), "?"),
            None if mem is None else int(mem),
            _str(d.get("capability")),
        )


@dataclass(frozen=True)
class NodeInfo:
    peer_id: str = ""
    version: str = ""
    os: str = ""
    cpu_count: int = 0
    ram_bytes: int | None = None
    torch: str = ""
    legacy: bool = False
    accelerators: tuple[Accelerator, ...] = ()
    addrs: tuple[str, ...] = ()
    ts: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> NodeInfo | None:
        if not isinstance(raw, Mapping):
            return None
        ram = _float(raw.get("ram_bytes"))
        return cls(
            peer_id=_str(raw.get("peer_id")),
            version=_str(raw.get("version")),
            os=_str(raw.get("os")),
            cpu_count=_int(raw.get("cpu_count")),
            ram_bytes=None if ram is None else int(ram),
            torch=_str(raw.get("torch")),
            legacy=bool(raw.get("legacy", False)),
            accelerators=tuple(Accelerator.parse(a) for a in as_list(raw.get("accelerators"))),
            addrs=tuple(_str(a) for a in as_list(raw.get("addrs"))),
            ts=_float(raw.get("ts")),
        )

    def device(self) -> str:
        """One short cell: the first accelerator and its memory, or the CPU and its RAM."""
        if self.accelerators:
            acc = self.accelerators[0]
            extra = f"+{len(self.accelerators) - 1}" if len(self.accelerators) > 1 else ""
            return f"{fmt.device_name(acc.name)}{extra} {fmt.human_bytes(acc.memory_bytes)}"
        return f"cpu×{self.cpu_count} {fmt.human_bytes(self.ram_bytes)}"


@dataclass(frozen=True)
class Peer:
    peer_id: str
    state: str = "up"
    rtt_ms: float | None = None
    last_seen: float | None = None
    addrs: tuple[str, ...] = ()
    info: NodeInfo | None = None
    rounds_contributed: int = 0
    penalty: float = 0.0
    reachability: str = "unknown"  # public, private, relayed or unknown (its own NodeInfo)
    connection: str = "none"  # direct, relayed or none (this node's link to it)

    @classmethod
    def parse(cls, raw: Any) -> Peer:
        d = _map(raw)
        return cls(
            peer_id=_str(d.get("peer_id"), "?"),
            state=_str(d.get("state"), "down"),
            rtt_ms=_float(d.get("rtt_ms")),
            last_seen=_float(d.get("last_seen")),
            addrs=tuple(_str(a) for a in as_list(d.get("addrs"))),
            info=NodeInfo.parse(d.get("info")),
            rounds_contributed=_int(d.get("rounds_contributed")),
            penalty=_float(d.get("penalty")) or 0.0,
            reachability=_str(d.get("reachability"), "unknown"),
            connection=_str(d.get("connection"), "none"),
        )


@dataclass(frozen=True)
class RoundMetrics:
    round: int
    loss: float | None = None
    accuracy: float | None = None
    contributors: int | None = None
    duration_s: float | None = None
    perplexity: float | None = None  # a language model's rounds
    sent_bytes: float | None = None  # what the round's updates weighed, all members (``update_bytes``)

    @classmethod
    def parse(cls, raw: Any) -> RoundMetrics:
        d = _map(raw)
        contributors = d.get("contributors")
        return cls(
            _int(d.get("round")),
            _float(d.get("loss")),
            _float(d.get("accuracy")),
            _int(contributors) if contributors is not None else None,
            _float(d.get("duration_s")),
            _float(d.get("perplexity")),
            _float(d.get("update_bytes")),
        )


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
        d = _map(raw)
        steps = d.get("steps")
        return cls(peer=_str(d.get("peer"), "?"), device=_str(d.get("device")),
                   steps=_int(steps) if steps is not None else None,
                   samples_per_s=_float(d.get("samples_per_s")), compute_s=_float(d.get("compute_s")),
                   compute_share=_float(d.get("compute_share")))


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
    stall: str = ""  # why the round in flight cannot commit (``waiting`` or ``stalled``)
    work: tuple[MemberWork, ...] = ()  # each member's work in the last committed round

    @classmethod
    def parse(cls, raw: Any) -> Job:
        d = _map(raw)
        return cls(
            job_id=_str(d.get("job_id"), "?"),
            name=_str(d.get("name")),
            state=_str(d.get("state"), "pending"),
            round=_int(d.get("round")),
            rounds=_int(d.get("rounds")),
            phase=_str(d.get("phase"), "idle"),
            phase_progress=min(1.0, max(0.0, _float(d.get("phase_progress")) or 0.0)),
            coordinator=_str(d.get("coordinator")),
            is_coordinator=bool(d.get("is_coordinator", False)),
            role=_str(d.get("role"), "idle"),
            members=tuple(_str(m) for m in as_list(d.get("members"))),
            metrics=tuple(RoundMetrics.parse(m) for m in as_list(d.get("metrics"))),
            stall=_str(d.get("waiting")) or _str(d.get("stalled")),
            work=tuple(MemberWork.parse(w) for w in as_list(d.get("work"))),
        )

    def round_progress(self) -> float:
        """Progress through the round in flight, counting each of the four phases as a
        quarter, so the bar moves steadily instead of refilling once per phase."""
        if self.state == "done" or self.phase == "done":
            return 1.0
        if self.phase not in PHASES:
            return 0.0
        return (PHASES.index(self.phase) + self.phase_progress) / len(PHASES)


@dataclass(frozen=True)
class Mesh:
    peers: int = 0
    up: int = 0
    suspect: int = 0
    down: int = 0


@dataclass(frozen=True)
class Status:
    peer_id: str = ""
    version: str = ""
    home: str = ""
    addrs: tuple[str, ...] = ()
    uptime_s: float | None = None
    mesh: Mesh = field(default_factory=Mesh)
    node_info: NodeInfo | None = None

    @classmethod
    def parse(cls, raw: Any) -> Status:
        d = _map(raw)
        m = _map(d.get("mesh"))
        return cls(
            peer_id=_str(d.get("peer_id")),
            version=_str(d.get("version")),
            home=_str(d.get("home")),
            addrs=tuple(_str(a) for a in as_list(d.get("addrs"))),
            uptime_s=_float(d.get("uptime_s")),
            mesh=Mesh(
                _int(m.get("peers")), _int(m.get("up")), _int(m.get("suspect")), _int(m.get("down"))
            ),
            node_info=NodeInfo.parse(d.get("node_info")),
        )


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
        d = _map(raw)
        rnd = d.get("round")
        return cls(
            _int(d.get("seq")),
            _float(d.get("ts")),
            _str(d.get("type"), "event"),
            _str(d.get("message")),
            _str(d.get("job")),
            _int(rnd) if rnd is not None else None,
            _str(d.get("peer")),
        )


@dataclass(frozen=True)
class Contribution:
    peer: str
    samples: int


@dataclass(frozen=True)
class LedgerRound:
    round: int
    coordinator: str = ""
    contributors: tuple[Contribution, ...] = ()
    metrics: RoundMetrics | None = None
    model_hash: str = ""
    prev_result_hash: str = ""
    result_hash: str = ""

    @classmethod
    def parse(cls, raw: Any) -> LedgerRound:
        d = _map(raw)
        contributors = tuple(
            Contribution(_str(_map(c).get("peer"), "?"), _int(_map(c).get("samples")))
            for c in as_list(d.get("contributors"))
        )
        metrics = _map(d.get("metrics"))
        return cls(
            round=_int(d.get("round")),
            coordinator=_str(d.get("coordinator")),
            contributors=contributors,
            metrics=RoundMetrics.parse({"round": d.get("round"), **metrics}) if metrics else None,
            model_hash=_str(d.get("model_hash")),
            prev_result_hash=_str(d.get("prev_result_hash")),
            result_hash=_str(d.get("result_hash")),
        )


def current_job(jobs: list[Job]) -> Job | None:
    """The job the overview follows: the newest running one, else the newest of all (the
    API lists jobs newest first)."""
    for job in jobs:
        if job.state == "running":
            return job
    return jobs[0] if jobs else None
