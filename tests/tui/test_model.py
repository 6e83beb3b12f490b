"""Parsing and formatting: lenient with what the node sends, stable in what it prints."""

from __future__ import annotations

from tui import format as fmt
from tui.model import Job, LedgerRound, Peer, Status, current_job


def test_short_ids_drop_the_shared_prefix_and_keep_both_ends() -> None:
    assert fmt.short_id("12D3KooWAbcdefghijklmnopWxyz") == "Abcd…Wxyz"
    assert fmt.short_id("Qm12") == "Qm12"
    assert fmt.short_id(None) == fmt.DASH


def test_human_units() -> None:
    assert fmt.human_bytes(8 << 30) == "8.0G"
    assert fmt.human_bytes(24 << 30) == "24G"
    assert fmt.human_bytes(512) == "512B"
    assert fmt.human_duration(754) == "12m34s"
    assert fmt.human_duration(90061) == "1d1h"
    assert fmt.rtt(0.8) == "0.8ms" and fmt.rtt(38.2) == "38ms" and fmt.rtt(None) == fmt.DASH
    assert fmt.ago(95.0, now=100.0) == "5s"


def test_parsing_tolerates_missing_null_and_wrong_fields() -> None:
    peer = Peer.parse(
        {"peer_id": "p", "state": "suspect", "rtt_ms": None, "info": None, "penalty": "x"}
    )
    assert (peer.state, peer.rtt_ms, peer.info, peer.penalty) == ("suspect", None, None, 0.0)
    assert Peer.parse("garbage").peer_id == "?"
    status = Status.parse({"mesh": None, "jobs": "nope"})
    assert status.mesh.peers == 0 and status.node_info is None
    entry = LedgerRound.parse({"round": 2, "contributors": [{"peer": "a", "samples": 3}, 7]})
    assert [c.samples for c in entry.contributors] == [3, 0] and entry.metrics is None


def test_round_progress_spans_the_four_phases() -> None:
    assert Job.parse({"job_id": "j", "phase": "plan", "phase_progress": 0.0}).round_progress() == 0
    assert (
        Job.parse({"job_id": "j", "phase": "reduce", "phase_progress": 0.5}).round_progress()
        == 0.625
    )
    assert Job.parse({"job_id": "j", "state": "done", "phase": "done"}).round_progress() == 1
    assert Job.parse({"job_id": "j", "phase": "idle"}).round_progress() == 0


def test_overview_follows_the_running_job() -> None:
    done, running = (
        Job.parse({"job_id": "a", "state": "done"}),
        Job.parse({"job_id": "b", "state": "running"}),
    )
    assert current_job([done, running]) is running
    assert current_job([done]) is done
    assert current_job([]) is None


def test_peers_show_their_work_in_the_followed_jobs_last_round() -> None:
    from tui.feed import Snapshot
    from tui.screens.peers import COLUMN_BY_KEY, COLUMNS, peer_cells, work_by_peer

    job = Job.parse({"job_id": "j1", "state": "running", "work": [
        {"peer": "A", "device": "GTX 1080 fp32", "steps": 40, "samples_per_s": 640.4, "compute_share": 0.45},
        {"peer": "B", "device": "CPU ×2 fp32", "steps": "x", "samples_per_s": None},
        "garbage"]})
    work = work_by_peer(Snapshot(jobs=(job,)))
    assert work["A"].steps == 40 and work["A"].device == "GTX 1080 fp32"
    cells = [str(c) for c in peer_cells(Peer.parse({"peer_id": "A"}), 0.0, work["A"])]
    assert "40" in cells and "640" in cells and "45%" in cells
    keys = [c.key for c in COLUMNS]
    assert str(peer_cells(Peer.parse({"peer_id": "C"}), 0.0, None)[keys.index("share")]) == fmt.DASH  # not in the round
    steps = COLUMN_BY_KEY["steps"].sort_key
    assert steps(Peer.parse({"peer_id": "A"}), work["A"], None) > steps(Peer.parse({"peer_id": "C"}), None, None)
