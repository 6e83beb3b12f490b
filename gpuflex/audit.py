"""Offline audit of a job's ledger: is the record of training intact, and who did the work?

A ledger file (``ledger.msgpack``, exported by ``gpuflex job results``) is a hash chain of
Results, each signed by its coordinator and carrying the signed plan, every signed
Update header, every leader's signed Partial, the metrics and (from the trust release on) the
rule applied and the job-spec hash. Verification needs no network and no node: only the
public keys inside the PeerIDs. The model check compares BLAKE3-256 of a *model blob*
(parameters plus server-optimizer state, the bytes the mesh hashes; exported as
``model.blob``) with the last result's ``model_hash``: a torch ``model.pt`` cannot be checked,
because it lacks the optimizer state that is part of the hashed bytes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from gpuflex.errors import GpuflexError
from gpuflex.node.core.ledger import LedgerError, verify_chain
from gpuflex.node.core.messages import (
    PARTIAL,
    PLAN,
    Result,
    parse_partial,
    parse_plan,
    parse_secagg_reports,
    walk_contributions,
)
from mesh.blob import blob_hash
from mesh.codec import WireError, open_envelope


class AuditError(GpuflexError, ValueError):
    """The first problem found; ``round`` is None for problems with the file as a whole."""

    def __init__(self, round_: int | None, reason: str) -> None:
        self.round, self.reason = round_, reason
        where = f"round {round_}" if round_ is not None else "ledger"
        super().__init__(f"{where}: {reason}")


@dataclass
class AuditReport:
    job: str
    rounds: int
    head: str
    model_hash: str
    model_checked: bool = False
    credit: dict[str, int] = field(default_factory=dict)
    #: The committed round whose model the checked file is (a job's results may hand out the
    #: best-scored round's model rather than the last one's).
    model_round: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True, "job": self.job, "rounds": self.rounds, "head": self.head,
                "model_hash": self.model_hash, "model_checked": self.model_checked,
                "model_round": self.model_round, "credit": self.credit}


def _round_of(message: str) -> int | None:
    head = message.split(":", 1)[0]
    if head.startswith("round ") and head[6:].isdigit():
        return int(head[6:])
    return None


def read_strict(path: str | Path) -> tuple[str, list[bytes]]:
    """(job, frames) of a ledger file, refusing anything but the exact format.

    The node's own reader is lenient about the unsigned wrapper (version, job id); an audit is
    not, so that no byte of the file can change without the check noticing.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise AuditError(None, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:
        raise AuditError(None, f"file cannot be read ({exc.__class__.__name__})") from None
    if not isinstance(body, dict) or set(body) != {"v", "job", "frames"} or body["v"] != 1:
        raise AuditError(None, "file is not a version-1 ledger")
    frames, job = body["frames"], body["job"]
    if not isinstance(job, str) or not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise AuditError(None, "file is not a version-1 ledger")
    if not frames:
        raise AuditError(None, "the ledger holds no rounds")
    if msgpack.packb(body, use_bin_type=True) != raw:
        raise AuditError(None, "file is not in canonical form (bytes were altered)")
    return job, frames


def load_results(path: str | Path) -> list[Result]:
    """Read and fully verify a ledger file; raises AuditError naming the first bad round."""
    job, frames = read_strict(path)
    try:
        results = verify_chain(frames, job)
    except LedgerError as exc:
        message = str(exc)
        raise AuditError(_round_of(message), message.split(": ", 1)[-1]) from None
    for res in results:
        _check_round(res, results[0])
    return results


def _check_round(res: Result, first: Result) -> None:
    """Checks verify_chain leaves to the node: plan links, membership, partial sums, spec."""
    plan = parse_plan(open_envelope(res.plan_frame, expect_kind=PLAN))
    if plan.prev_result != res.prev_result:
        raise AuditError(res.round, "the plan extends a different previous result")
    contributions = walk_contributions(res.updates, res.partials, res.job, res.round)
    members = set(plan.members)
    for up in contributions:
        if up.peer not in members:
            raise AuditError(res.round, f"contribution from {up.peer}, who is not in the plan")
    if len({u.peer for u in contributions}) != len(contributions):
        raise AuditError(res.round, "a peer contributes more than once")
    _check_partials(res.round, res.partials, res.job)
    spec_hash = res.env.body.get("spec_hash") if isinstance(res.env.body, dict) else None
    first_hash = first.env.body.get("spec_hash") if isinstance(first.env.body, dict) else None
    if spec_hash != first_hash:
        raise AuditError(res.round, "the job spec hash changed between rounds")


def _check_partials(round_: int, frames: list[bytes], job: str, depth: int = 0) -> None:
    for frame in frames:
        part = parse_partial(open_envelope(frame, expect_kind=PARTIAL))
        covered = walk_contributions(part.updates, part.partials, job, round_)
        if sum(u.samples for u in covered) != part.samples:
            raise AuditError(round_, f"partial of leader {part.leader} claims the wrong sample count")
        _check_partials(round_, part.partials, job, depth + 1)


def credit(results: list[Result]) -> dict[str, int]:
    """Sample-steps accepted per peer: samples processed in local training, summed over rounds.

    The figure comes from each signed Update's ``samples`` metric (every local epoch or step
    counts), falling back to its header sample count (the FedAvg weight). Only updates inside
    a committed, verified result count, so the figure can back rewards.
    """
    total: dict[str, int] = defaultdict(int)
    for res in results:
        for up in walk_contributions(res.updates, res.partials, res.job, res.round):
            steps = up.metrics.get("samples")
            total[up.peer] += int(steps) if isinstance(steps, (int, float)) and steps > 0 else up.samples
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def verify_ledger(path: str | Path, model: str | Path | None = None) -> AuditReport:
    """Verify every signature and hash link, and optionally that a model blob is the model a
    committed round names (the last one's, or the best round's that ``job results`` hands out)."""
    results = load_results(path)
    last = results[-1]
    report = AuditReport(job=last.job, rounds=len(results), head=last.digest,
                         model_hash=last.model_hash, credit=credit(results))
    if model is not None:
        try:
            data = Path(model).read_bytes()
        except OSError as exc:
            raise AuditError(None, f"cannot read model file {model}: {exc}") from None
        digest = blob_hash(data)
        match = next((res for res in reversed(results) if res.model_hash == digest), None)
        if match is None:
            raise AuditError(last.round, f"model file hash {digest[:16]}… matches no committed "
                             f"round's model (the last one's is {last.model_hash[:16]}…)")
        report.model_checked, report.model_round, report.model_hash = True, match.round, digest
    return report


def _secagg_reports(body: dict[str, Any], round_: int) -> list[dict[str, Any]]:
    """The secure-aggregation group reports a result carries (who masked, who dropped, whether
    the sum was recovered); a malformed list is an audit failure, not a crash."""
    try:
        return list(parse_secagg_reports(body.get("secagg", []), "result"))
    except WireError as exc:
        raise AuditError(round_, f"secure-aggregation report is malformed: {exc}") from None


def round_rows(results: list[Result]) -> list[dict[str, Any]]:
    """Per round: coordinator, leaders, contributors with samples, absentees, rule, metrics, and
    the secure-aggregation group reports."""
    rows = []
    for res in results:
        body = res.env.body if isinstance(res.env.body, dict) else {}
        leaders = [parse_partial(open_envelope(f, expect_kind=PARTIAL)).leader for f in res.partials]
        rows.append({
            "round": res.round, "coordinator": res.coordinator, "leaders": leaders,
            "contributors": [{"peer": u.peer, "samples": u.samples, "delta_hash": u.delta_hash}
                             for u in walk_contributions(res.updates, res.partials, res.job, res.round)],
            "absent": list(res.absent), "rule": body.get("rule"), "strategy": res.strategy,
            "metrics": res.metrics, "model_hash": res.model_hash, "result_hash": res.digest,
            "secagg": _secagg_reports(body, res.round),
        })
    return rows
