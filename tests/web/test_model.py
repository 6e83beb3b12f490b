"""What the portal makes of the control API's JSON, and the credit it computes from ledgers."""

from __future__ import annotations

import csv
import io
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex_web.credit import compute_credit, credit_csv, csv_cell
from gpuflex_web.model import MAX_TEXT, Job, LedgerRound, Peer, Status

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=200),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20,
)
KEYS = ["peer_id", "state", "rtt_ms", "info", "reachability", "job_id", "name", "round", "rounds",
        "phase", "metrics", "members", "contributors", "samples", "peer", "accelerators", "mesh",
        "addrs", "legacy", "compute_s", "compute_share", "spec", "phase_progress"]
RECORDS = st.dictionaries(st.sampled_from(KEYS), JSON, max_size=10) | JSON


@settings(max_examples=50, deadline=None)
@given(RECORDS)
def test_any_json_parses_without_error_and_strings_stay_bounded(raw: Any) -> None:
    peer, job, rnd, status = Peer.parse(raw), Job.parse(raw), LedgerRound.parse(raw), Status.parse(raw)
    assert peer.state in ("up", "suspect", "down")
    assert peer.reachability in ("public", "private", "relayed", "unknown")
    assert 0.0 <= job.progress <= 1.0
    for text in (peer.peer_id, peer.device, job.name, job.label, job.waiting, *status.addrs,
                 *(c.peer for c in rnd.contributors)):
        assert isinstance(text, str) and len(text) <= max(MAX_TEXT, 300)


def ledger(*rounds: list[dict[str, Any]]) -> tuple[LedgerRound, ...]:
    return tuple(LedgerRound.parse({"round": i + 1, "contributors": c}) for i, c in enumerate(rounds))


def test_credit_by_samples_when_the_ledger_has_no_compute_time() -> None:
    credit = compute_credit({
        "j1": ledger([{"peer": "A", "samples": 300}, {"peer": "B", "samples": 100}],
                     [{"peer": "A", "samples": 300}]),
        "j2": ledger([{"peer": "B", "samples": 200}]),
    })
    assert credit.basis == "samples" and credit.rounds == 3 and credit.jobs == 2
    assert [(p.peer, p.jobs, p.rounds, p.samples, round(p.share, 4)) for p in credit.peers] == [
        ("A", 1, 2, 600, 0.6667), ("B", 2, 2, 300, 0.3333)]
    assert [(j.job_id, j.peer, j.rounds, j.samples) for j in credit.per_job] == [
        ("j1", "A", 2, 600), ("j1", "B", 1, 100), ("j2", "B", 1, 200)]


def test_credit_by_compute_time_when_every_contribution_records_it() -> None:
    credit = compute_credit({"j": ledger(
        [{"peer": "fast", "samples": 900, "compute_s": 1.0}, {"peer": "slow", "samples": 100, "compute_s": 3.0}])})
    assert credit.basis == "compute time"
    assert {p.peer: (p.share, p.seconds) for p in credit.peers} == {"slow": (0.75, 3.0), "fast": (0.25, 1.0)}


def test_credit_by_recorded_shares_inside_the_round_metrics() -> None:
    rows = tuple(LedgerRound.parse({
        "round": r, "contributors": [{"peer": "A", "samples": 10}, {"peer": "B", "samples": 10}],
        "metrics": {"members": [{"peer": "A", "compute_share": a, "device": "RTX 3090"},
                                {"peer": "B", "compute_share": 1 - a, "device": "cpu"}]}})
        for r, a in ((1, 0.8), (2, 0.6)))
    credit = compute_credit({"j": rows})
    assert credit.basis == "compute share"
    assert {p.peer: round(p.share, 6) for p in credit.peers} == {"A": 0.7, "B": 0.3}
    assert rows[0].contributors[0].extra == {"device": "RTX 3090"}


def test_credit_of_nothing_is_empty() -> None:
    credit = compute_credit({"j": ()})
    assert credit.peers == () and credit.jobs == 1
    assert credit_csv(credit).splitlines() == [
        "peer,jobs,rounds,samples,compute_seconds,compute_share,share_basis"]


def test_csv_cells_never_start_a_formula() -> None:
    assert [csv_cell(v) for v in ("=1+1", "+A1", "-2", "@SUM(A1)", "12D3KooW", 3)] == [
        "'=1+1", "'+A1", "'-2", "'@SUM(A1)", "12D3KooW", "3"]
    credit = compute_credit({"j": ledger([{"peer": "=HYPERLINK(\"x\")", "samples": 1}])})
    row = next(csv.DictReader(io.StringIO(credit_csv(credit))))
    assert row["peer"].startswith("'=")


def test_the_nodes_ledger_rows_fill_each_contributions_work() -> None:
    # The shape the node's ``ledger`` method really returns (gpuflex.node.core.ledger.result_row).
    from gpuflex.node.core.ledger import result_row, verify_chain
    from tests.unit.node.chain import JOB, make_chain

    frames, _ = make_chain(rounds=1, work=lambda r, k: {
        "steps": 3 + k, "device": f"dev{k} fp32", "compute_s": 1.0 + k, "samples_per_s": 50.0 * (k + 1),
        "compute_share": (1.0 + k) / 6})
    (row,) = [result_row(r) for r in verify_chain(frames, JOB)]
    parsed = LedgerRound.parse(row)
    by_device = {c.extra["device"]: c for c in parsed.contributors}
    assert by_device["dev2 fp32"].seconds == 3.0 and by_device["dev2 fp32"].share == 0.5
    assert by_device["dev2 fp32"].extra["local steps"] == "5" and by_device["dev0 fp32"].extra["samples/s"] == "50"
    credit = compute_credit({JOB: [parsed]})
    assert credit.basis == "compute time" and max(p.share for p in credit.peers) == 0.5
