"""Offline audit: every tampering is caught, credit is counted, and the CLI exit codes say so."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
from typer.testing import CliRunner

from gpuflex.audit import AuditError, credit, load_results, verify_ledger
from gpuflex.cli.main import app
from gpuflex.node.core.messages import RESULT
from mesh.codec import open_envelope, seal
from tests.unit.node.chain import JOB, make_chain


def write(path: Path, frames: list[bytes], job: str = JOB) -> Path:
    path.write_bytes(msgpack.packb({"v": 1, "job": job, "frames": frames}, use_bin_type=True))
    return path


@pytest.fixture
def chain() -> tuple[list[bytes], list]:
    return make_chain(3, 3)


def test_clean_ledger_verifies_and_credits(tmp_path: Path, chain: tuple) -> None:
    frames, ids = chain
    report = verify_ledger(write(tmp_path / "l", frames))
    assert report.rounds == 3 and report.job == JOB
    # each peer k reports 10 + k samples in each of the 3 rounds
    assert report.credit == {ids[2].peer_id: 36, ids[1].peer_id: 33, ids[0].peer_id: 30}
    assert credit(load_results(tmp_path / "l")) == report.credit


def test_tampering_any_byte_is_caught(tmp_path: Path, chain: tuple) -> None:
    frames, _ = chain
    data = (write(tmp_path / "l", frames)).read_bytes()
    bad = tmp_path / "bad"
    for pos in range(0, len(data), max(1, len(data) // 400)):
        bad.write_bytes(data[:pos] + bytes([data[pos] ^ 0x01]) + data[pos + 1:])
        with pytest.raises(AuditError):
            verify_ledger(bad)


def test_removed_round_is_caught(tmp_path: Path, chain: tuple) -> None:
    frames, _ = chain
    with pytest.raises(AuditError) as info:
        verify_ledger(write(tmp_path / "l", [frames[0], frames[2]]))
    assert info.value.round == 2 and "missing" in info.value.reason


def test_swapped_contribution_is_caught(tmp_path: Path, chain: tuple) -> None:
    """A coordinator that re-signs a result with another round's update cannot hide it."""
    frames, ids = chain
    env = open_envelope(frames[1])
    body = dict(env.body)
    other = open_envelope(frames[2]).body["updates"][0]
    body["updates"] = [other, *body["updates"][1:]]
    coordinator = next(i for i in ids if i.peer_id == body["coordinator"])
    forged = seal(coordinator, RESULT, body)
    with pytest.raises(AuditError) as info:
        verify_ledger(write(tmp_path / "l", [frames[0], forged, frames[2]]))
    assert info.value.round == 2


def test_model_must_be_a_committed_rounds_model_and_the_report_names_the_round(tmp_path: Path, chain: tuple) -> None:
    frames, _ = chain
    ledger = write(tmp_path / "l", frames)
    good = tmp_path / "model.blob"
    good.write_bytes(b"model-3")  # make_chain's round-3 model hash is blob_hash(b"model-3")
    report = verify_ledger(ledger, good)
    assert report.model_checked and report.model_round == 3
    (tmp_path / "best.blob").write_bytes(b"model-2")  # a best round's model, handed out by `job results`
    assert verify_ledger(ledger, tmp_path / "best.blob").model_round == 2
    (tmp_path / "other.blob").write_bytes(b"model-9")
    with pytest.raises(AuditError, match=r"round 3: model file hash .* matches no committed round"):
        verify_ledger(ledger, tmp_path / "other.blob")


def test_cli_exit_codes(tmp_path: Path, chain: tuple) -> None:
    frames, _ = chain
    runner = CliRunner()
    good = write(tmp_path / "good", frames)
    ok = runner.invoke(app, ["audit", "verify", str(good), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["rounds"] == 3
    bad = write(tmp_path / "bad", [frames[0], frames[2]])
    res = runner.invoke(app, ["audit", "verify", str(bad)])
    assert res.exit_code == 1 and "round 2" in res.output
    res = runner.invoke(app, ["audit", "verify", str(bad), "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["round"] == 2
    shown = runner.invoke(app, ["audit", "show", str(good)])
    assert shown.exit_code == 0 and "round 3" in shown.output and "sample-steps" in shown.output
    data = json.loads(runner.invoke(app, ["audit", "show", str(good), "--json"]).stdout)
    assert [len(r["contributors"]) for r in data["rounds"]] == [3, 3, 3]
    assert runner.invoke(app, ["audit", "verify", str(tmp_path / "nope")]).exit_code == 1


def test_show_lists_each_secure_aggregation_group_report(tmp_path: Path) -> None:
    _, ids = make_chain(1, 3)  # the same fixed identities sign every chain make_chain builds
    leader, member, gone = (i.peer_id for i in ids)
    reports = {2: [{"leader": leader, "attempt": 0, "survivors": [leader, member], "dropped": [gone],
                    "recovered": True, "reason": ""}],
               3: [{"leader": member, "attempt": 1, "survivors": [member], "dropped": [leader, gone],
                    "recovered": False, "reason": "2 survivors < threshold 3"}]}
    frames, _ = make_chain(3, 3, secagg=reports)
    runner = CliRunner()
    shown = runner.invoke(app, ["audit", "show", str(write(tmp_path / "l", frames))])
    assert shown.exit_code == 0, shown.output
    lines = [line for line in shown.output.splitlines() if "secure aggregation" in line]
    assert len(lines) == 2
    assert "2 masked and present" in lines[0] and lines[0].endswith("; recovered")
    assert "(attempt 1)" in lines[1] and "not recovered: 2 survivors < threshold 3" in lines[1]
    data = json.loads(runner.invoke(app, ["audit", "show", str(tmp_path / "l"), "--json"]).stdout)
    assert [len(r["secagg"]) for r in data["rounds"]] == [0, 1, 1]


def test_show_refuses_a_malformed_secure_aggregation_report(tmp_path: Path) -> None:
    frames, _ = make_chain(2, 3, secagg={2: [{"leader": 7}]})
    shown = CliRunner().invoke(app, ["audit", "show", str(write(tmp_path / "l", frames))])
    assert shown.exit_code == 1 and "round 2" in shown.output and "secure-aggregation report" in shown.output
