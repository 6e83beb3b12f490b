"""Who did the work: per-peer credit across every job's ledger, and its CSV.

The figures come from the committed rounds only (the ``ledger`` method), the same records that
``gpuflex audit show`` reads from ``ledger.msgpack``: a peer's rounds are the rounds whose
result lists it as a contributor, and its samples are the sum of its listed sample counts.

The compute share uses the best measure the ledger carries. When every contribution records
its training time, the share is of the summed time; when the rounds carry a per-member compute
share instead, it is the mean of those shares over the rounds; otherwise it falls back to the
share of samples, and the page says which basis it used.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuflex_web.model import LedgerRound

Basis = Literal["compute time", "compute share", "samples"]
BASIS_NOTE: dict[Basis, str] = {
    "compute time": "share of the training time recorded in the ledger",
    "compute share": "mean of the per-round compute shares recorded in the ledger",
    "samples": "share of samples processed (the ledger records no compute time)",
}
CSV_COLUMNS = ("peer", "jobs", "rounds", "samples", "compute_seconds", "compute_share", "share_basis")


@dataclass(frozen=True)
class PeerCredit:
    peer: str
    jobs: int
    rounds: int
    samples: int
    seconds: float | None
    share: float


@dataclass(frozen=True)
class JobCredit:
    job_id: str
    peer: str
    rounds: int
    samples: int


@dataclass(frozen=True)
class Credit:
    peers: tuple[PeerCredit, ...] = ()
    per_job: tuple[JobCredit, ...] = ()
    basis: Basis = "samples"
    rounds: int = 0
    jobs: int = 0

    @property
    def note(self) -> str:
        return BASIS_NOTE[self.basis]


def compute_credit(ledgers: Mapping[str, Sequence[LedgerRound]]) -> Credit:
    """Credit per peer over ``{job_id: rounds}``; peers ordered by share, then id."""
    rounds = [r for rows in ledgers.values() for r in rows if r.contributors]
    contributions = [c for r in rounds for c in r.contributors]
    if not contributions:
        return Credit(jobs=len(ledgers))
    if all(c.seconds is not None for c in contributions):
        basis: Basis = "compute time"
    elif all(c.share is not None for c in contributions):
        basis = "compute share"
    else:
        basis = "samples"
    total_samples = sum(c.samples for c in contributions)
    total_seconds = sum(c.seconds or 0.0 for c in contributions)
    peers: dict[str, dict[str, float]] = {}
    jobs_of: dict[str, set[str]] = {}
    per_job: dict[tuple[str, str], list[int]] = {}
    for job_id, rows in ledgers.items():
        for r in rows:
            for c in r.contributors:
                p = peers.setdefault(c.peer, {"rounds": 0, "samples": 0, "seconds": 0.0, "share": 0.0})
                p["rounds"] += 1
                p["samples"] += c.samples
                p["seconds"] += c.seconds or 0.0
                p["share"] += c.share or 0.0
                jobs_of.setdefault(c.peer, set()).add(job_id)
                cell = per_job.setdefault((job_id, c.peer), [0, 0])
                cell[0] += 1
                cell[1] += c.samples

    def share(p: dict[str, float]) -> float:
        if basis == "compute time":
            return p["seconds"] / total_seconds if total_seconds > 0 else 0.0
        if basis == "compute share":
            return p["share"] / len(rounds)
        return p["samples"] / total_samples if total_samples > 0 else 0.0

    rows_out = [PeerCredit(peer, len(jobs_of[peer]), int(p["rounds"]), int(p["samples"]),
                           p["seconds"] if basis == "compute time" else None, share(p))
                for peer, p in peers.items()]
    rows_out.sort(key=lambda row: (-row.share, -row.samples, row.peer))
    return Credit(peers=tuple(rows_out),
                  per_job=tuple(JobCredit(j, p, v[0], v[1]) for (j, p), v in sorted(per_job.items())),
                  basis=basis, rounds=len(rounds), jobs=len(ledgers))


def csv_cell(value: object) -> str:
    """A cell a spreadsheet will not run: text that starts like a formula gets a leading quote."""
    s = str(value)
    return "'" + s if s[:1] in ("=", "+", "-", "@", "\t", "\r") else s


def credit_csv(credit: Credit) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in credit.peers:
        seconds = "" if row.seconds is None else f"{row.seconds:.3f}"
        writer.writerow([csv_cell(v) for v in (row.peer, row.jobs, row.rounds, row.samples, seconds,
                                                  f"{row.share:.6f}", credit.basis)])
    return buf.getvalue()


def top(credit: Credit, n: int = 12) -> Iterable[PeerCredit]:
    """The peers a chart has room for; the table lists them all."""
    return credit.peers[:n]
