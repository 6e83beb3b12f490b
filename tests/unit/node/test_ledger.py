from __future__ import annotations

import errno
import gc
import itertools
import os
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuflex.audit import load_results, read_strict
from gpuflex.node.core.evidence import verify_round
from gpuflex.node.core.forkchoice import chain_weight, prefer_chain
from gpuflex.node.core.kept import WHOLE_ROUNDS, FrameRows, is_slim, kept
from gpuflex.node.core.ledger import (
    HEAD_CHARS,
    Ledger,
    LedgerClaim,
    LedgerError,
    result_row,
    verify_chain,
)
from gpuflex.node.core.ledgerfile import export_bytes, read_ledger_file
from gpuflex.node.core.messages import RESULT, Result, parse_result
from gpuflex.node.core.workfields import DEVICE_CHARS
from mesh.codec import SIGNING_DOMAIN, open_envelope, seal
from mesh.fsutil import StateWriteError
from tests.unit.node.chain import JOB, make_chain, private_branch, rules_for


def test_a_real_chain_verifies() -> None:
    frames, _ = make_chain(4)
    results = verify_chain(frames, JOB)
    assert [r.round for r in results] == [1, 2, 3, 4]
    assert results[1].prev_result == results[0].digest


def test_any_flipped_byte_is_caught() -> None:
    frames, _ = make_chain(3)
    for i in range(len(frames)):
        for pos in range(0, len(frames[i]), max(1, len(frames[i]) // 40)):
            bad = bytearray(frames[i])
            bad[pos] ^= 0x01
            tampered = [*frames[:i], bytes(bad), *frames[i + 1 :]]
            with pytest.raises(LedgerError):
                verify_chain(tampered, JOB)


def test_removed_round_is_caught() -> None:
    frames, _ = make_chain(3)
    with pytest.raises(LedgerError, match="round 2"):
        verify_chain([frames[0], frames[2]], JOB)


def test_swapped_contribution_is_caught() -> None:
    frames, ids = make_chain(2)
    env = open_envelope(frames[1])
    body = dict(env.body)
    # The coordinator re-signs a result whose contributor list no longer matches the updates.
    contributors = [dict(c) for c in body["contributors"]]
    contributors[0]["samples"], contributors[1]["samples"] = contributors[1]["samples"], contributors[0]["samples"]
    body["contributors"] = contributors
    coord = next(i for i in ids if i.peer_id == env.sender)
    with pytest.raises(LedgerError, match="contributor"):
        verify_chain([frames[0], seal(coord, RESULT, body)], JOB)


def test_result_signed_by_someone_else_is_caught() -> None:
    frames, ids = make_chain(1)
    env = open_envelope(frames[0])
    header = msgpack.unpackb(msgpack.unpackb(frames[0])[0])
    other = next(i for i in ids if i.peer_id != env.sender)
    raw = msgpack.packb(header, use_bin_type=True)
    forged = msgpack.packb([raw, other.sign(SIGNING_DOMAIN + raw)], use_bin_type=True)
    with pytest.raises(LedgerError, match="signature"):
        verify_chain([forged], JOB)


def _filled(path: Path, frames: list[bytes]) -> Ledger:
    ledger = Ledger(path, JOB)
    for frame in frames:
        ledger.append(frame, parse_result(open_envelope(frame)))
    return ledger


def test_a_torn_last_round_is_cut_off_and_the_rounds_before_it_stand(tmp_path: Path) -> None:
    frames, _ = make_chain(3)
    ledger = _filled(tmp_path / "ledger.msgpack", frames)
    whole = ledger.path.stat().st_size
    ledger.path.write_bytes(ledger.path.read_bytes()[:-50])  # torn write
    fresh = Ledger(tmp_path / "ledger.msgpack", JOB)
    problems = fresh.load()
    assert problems and "ledger.msgpack" in problems[0] and "round 3" in problems[0]
    assert len(fresh) == 2 and list(fresh.frames) == frames[:2]
    assert fresh.path.stat().st_size == whole - len(frames[2]) - 3  # the torn tail is cut off
    fresh.append(frames[2], parse_result(open_envelope(frames[2])))  # and round 3 follows round 2
    again = Ledger(tmp_path / "ledger.msgpack", JOB)
    assert again.load() == [] and list(again.frames) == frames


def test_a_corrupt_middle_round_keeps_the_rounds_before_it(tmp_path: Path) -> None:
    frames, _ = make_chain(3)
    ledger = _filled(tmp_path / "ledger.msgpack", frames)
    data = bytearray(ledger.path.read_bytes())
    data[data.index(frames[1]) + len(frames[1]) // 2] ^= 0x01
    ledger.path.write_bytes(bytes(data))
    fresh = Ledger(tmp_path / "ledger.msgpack", JOB)
    problems = fresh.load()
    assert problems and "round 2" in problems[0]
    assert list(fresh.frames) == frames[:1]


def test_each_round_appends_its_own_frame_and_nothing_else(tmp_path: Path) -> None:
    frames, _ = make_chain(4)
    ledger = Ledger(tmp_path / "ledger.msgpack", JOB)
    sizes = []
    for frame in frames:
        ledger.append(frame, parse_result(open_envelope(frame)))
        sizes.append(ledger.path.stat().st_size)
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    assert growth == [len(msgpack.packb(f, use_bin_type=True)) for f in frames[1:]]
    assert not ledger.backup.exists()
    assert ledger.frames[1] == frames[1] and ledger.frames[-1] == frames[-1] and ledger.frames[1:3] == frames[1:3]
    assert ledger.frames == frames and len(ledger.frames) == 4
    with pytest.raises(IndexError):
        ledger.frames[4]


def test_a_view_of_the_frames_outlives_a_rewrite_of_the_file(tmp_path: Path) -> None:
    frames, _ = make_chain(3)
    ledger = _filled(tmp_path / "ledger.msgpack", frames)
    view = ledger.frames
    ledger.replace(frames[:2])  # not an extension of ours: the file is rewritten whole
    assert list(ledger.frames) == frames[:2]
    assert list(view) == frames  # read from the file as it was when the view was made
    ledger.replace(frames)  # an extension: appended
    assert list(ledger.frames) == frames


def test_an_older_nodes_whole_file_ledger_and_its_previous_copy_still_load(tmp_path: Path) -> None:
    frames, _ = make_chain(3)
    path = tmp_path / "ledger.msgpack"
    path.write_bytes(msgpack.packb({"v": 1, "job": JOB, "frames": frames}, use_bin_type=True)[:-50])  # torn
    (tmp_path / "ledger.msgpack.prev").write_bytes(msgpack.packb({"v": 1, "job": JOB, "frames": frames[:2]},
                                                                 use_bin_type=True))
    ledger = Ledger(path, JOB)
    problems = ledger.load()
    assert problems and "ledger.msgpack:" in problems[0]
    assert list(ledger.frames) == frames[:2]  # the previous copy: the longer verified chain
    assert not ledger.backup.exists()  # what it held is in the rewritten file
    again = Ledger(path, JOB)
    assert again.load() == [] and list(again.frames) == frames[:2]  # rewritten in the append-only format
    assert read_ledger_file(path) == frames[:2]


def test_the_exported_ledger_is_the_whole_chain_in_one_map_and_audits(tmp_path: Path) -> None:
    frames, _ = make_chain(3)
    ledger = _filled(tmp_path / "ledger.msgpack", frames)
    out = tmp_path / "export.msgpack"
    out.write_bytes(export_bytes(ledger.path, JOB))
    assert read_strict(out) == (JOB, frames)
    assert [r.round for r in load_results(out)] == [1, 2, 3]


def test_a_failed_append_leaves_the_file_and_the_ledger_as_they_were(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    frames, _ = make_chain(3)
    ledger = _filled(tmp_path / "ledger.msgpack", frames[:2])
    before = ledger.path.read_bytes()

    def full(fd: int, data: memoryview, at: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(StateWriteError):
        ledger.append(frames[2], parse_result(open_envelope(frames[2])))
    monkeypatch.undo()
    assert ledger.path.read_bytes() == before and len(ledger) == 2 and list(ledger.frames) == frames[:2]
    ledger.append(frames[2], parse_result(open_envelope(frames[2])))
    assert list(ledger.frames) == frames


def test_append_refuses_a_result_that_does_not_extend_the_chain(tmp_path: Path) -> None:
    frames, _ = make_chain(2)
    ledger = Ledger(tmp_path / "l.msgpack", JOB)
    with pytest.raises(LedgerError):
        ledger.append(frames[1], parse_result(open_envelope(frames[1])))


def test_rows_carry_each_members_work_bounded_and_steps_match_the_signed_updates() -> None:
    def work(r: int, k: int) -> dict:
        return {"steps": 3 + k, "device": "GTX 1080 fp32\x1b[31m" + "x" * 100, "compute_s": 2.0,
                "samples_per_s": float("inf") if k == 1 else 96.5, "compute_share": 1 / 3, "extra": "dropped"}

    frames, _ = make_chain(rounds=2, work=work)
    rows = [result_row(r) for r in verify_chain(frames, JOB)]
    first = rows[0]["contributors"][0]
    assert first["steps"] == 3 and first["compute_s"] == 2.0 and first["samples_per_s"] == 96.5
    assert first["device"].startswith("GTX 1080 fp32") and "\x1b" not in first["device"]
    assert len(first["device"]) <= DEVICE_CHARS and "extra" not in first
    assert "samples_per_s" not in rows[0]["contributors"][1]  # not a finite number: left out

    lied, _ = make_chain(rounds=1, work=lambda r, k: {"steps": 300})  # more steps than signed
    with pytest.raises(LedgerError, match="step count"):
        verify_chain(lied, JOB)


def test_a_budgeted_rounds_updates_take_no_more_steps_than_their_plan_allowed() -> None:
    def work(r: int, k: int) -> dict:
        return {"steps": 3 + k}

    verify_chain(make_chain(rounds=2, work=work, planned=5)[0], JOB)  # members signed 3, 4, 5 steps
    over, _ = make_chain(rounds=1, work=work, planned=4)  # the last member signed 5 of 4 allowed
    with pytest.raises(LedgerError, match="more local steps than its plan allowed"):
        verify_chain(over, JOB)


@dataclass(frozen=True)
class _Res:
    """What fork choice reads of a result: its attempt, digest and counted contributors."""

    attempt: int
    digest: str
    contributors: tuple[str, ...] = ("a", "b", "c")


def weighs(n: int) -> tuple[str, ...]:
    return ("p",) * n


chains = st.lists(st.tuples(st.integers(0, 2), st.sampled_from("abc"), st.integers(1, 3)), max_size=5).map(
    lambda xs: [_Res(a, f"{d}{a}w{w}.{i}", weighs(w)) for i, (a, d, w) in enumerate(xs)])  # a digest fixes its round


def settle(start: list, offers: list[list]) -> list:
    """What a node holding ``start`` ends with after hearing ``offers`` in that order."""
    held = start
    for offer in offers:
        if prefer_chain(held, offer):
            held = offer
    return held


def test_a_root_that_died_with_its_round_rejoins_and_every_node_settles_on_one_chain() -> None:
    shared = [_Res(0, "r1"), _Res(0, "r2")]
    # Round 3's root committed with all four members, died before its result went out, and
    # comes back with that branch; the mesh retried round 3 without it and went on.
    hidden = [*shared, _Res(0, "r3-hidden", weighs(4))]
    mesh = [*shared, _Res(1, "r3", weighs(3)), _Res(0, "r4", weighs(3))]
    behind = mesh[:-1]  # a node one round behind on the mesh's branch
    assert prefer_chain(hidden, mesh) and not prefer_chain(mesh, hidden)  # the root takes the mesh's chain
    assert prefer_chain(behind, mesh) and not prefer_chain(mesh, behind)  # nobody is pulled back
    # Before the mesh went on, the root's round counts more than the retry: its branch wins
    # and every node settles on it; either way, on the same one from wherever it starts.
    assert prefer_chain(behind, hidden) and not prefer_chain(hidden, behind)
    held = [hidden, mesh, behind]
    for start in held:
        for order in itertools.permutations(held):
            assert settle(start, list(order)) == mesh


def test_an_open_jobs_sybil_branch_that_is_longer_but_lighter_loses() -> None:
    honest, ids = make_chain(rounds=4, members=4)  # every round counts all four members
    rules = rules_for(ids)  # an open job, min_nodes=2
    sybils = ids[2:]  # one party's two keys, members of round 1's committed plan
    branch = private_branch(honest, ids, sybils, upto=6)  # it commits as fast as it likes
    ours, theirs = verify_chain(honest, JOB, rules), verify_chain(branch, JOB, rules)  # its evidence holds
    assert len(theirs) > len(ours) and chain_weight(theirs) < chain_weight(ours)  # 6 rounds weighing 14 < 16
    assert not prefer_chain(ours, theirs) and prefer_chain(theirs, ours)
    # The limit an open job keeps: once its rounds since the fork count more contributions
    # than the honest ones did (two more rounds here: 18 > 16), the branch wins.
    assert prefer_chain(ours, verify_chain(private_branch(honest, ids, sybils, upto=8), JOB, rules))


def test_a_claim_in_presence_or_a_sync_page_is_only_a_reason_to_fetch(tmp_path: Path) -> None:
    frames, ids = make_chain(rounds=3, members=3)
    ledger = Ledger(tmp_path / "l.msgpack", JOB, rules_for(ids))
    ledger.replace(frames)
    head = ledger.head[:HEAD_CHARS]
    assert (ledger.weight, len(ledger)) == (9, 3)
    assert ledger.may_win(LedgerClaim.from_wire(2, 10, "x" * HEAD_CHARS))  # heavier though shorter: fetched
    assert not ledger.may_win(LedgerClaim.from_wire(5, 8, "x" * HEAD_CHARS))  # longer but lighter: not
    # as heavy: longer, or another head
    assert ledger.may_win(LedgerClaim.from_wire(4, 9)) and not ledger.may_win(LedgerClaim.from_wire(3, 9, head))
    assert ledger.may_win(LedgerClaim.from_wire(3, 9, "x" * HEAD_CHARS))
    # a peer that says no weight: by height
    assert ledger.may_win(LedgerClaim.from_wire(4)) and not ledger.may_win(LedgerClaim.from_wire(3, None, head))
    for junk in (True, -1, "9", 1.5, None):
        assert not ledger.may_win(LedgerClaim.from_wire(junk, 10**9, "x" * HEAD_CHARS))
    assert ledger.frames == frames  # nothing a peer says changes the ledger


@given(a=chains, b=chains, c=chains)
def test_fork_choice_is_one_strict_total_order_by_weight_then_length(a: list, b: list, c: list) -> None:
    if [r.digest for r in a] != [r.digest for r in b]:
        assert prefer_chain(a, b) != prefer_chain(b, a)  # exactly one of two different chains wins
        if chain_weight(a) != chain_weight(b):
            assert prefer_chain(a, b) == (chain_weight(b) > chain_weight(a))  # the heavier
    else:
        assert not prefer_chain(a, b)
    if prefer_chain(a, b) and prefer_chain(b, c):
        assert prefer_chain(a, c)  # transitive: every node settles on the same chain


def retained_bytes(make: Callable[[], object]) -> tuple[object, int]:
    """What ``make()`` returns, and the bytes it allocated that are still held."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        value = make()
        gc.collect()
        held = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    return value, held


def test_a_kept_result_drops_its_evidence_and_less_than_half_its_memory_but_checks_the_same(tmp_path: Path) -> None:
    frames, ids = make_chain(rounds=3, members=24)
    def parsed(frame: bytes) -> Result:
        res = parse_result(open_envelope(frame, expect_kind=RESULT))
        assert res.plan and res.digest  # as a check of its evidence leaves it: plan parsed, digest taken
        return res

    full, full_bytes = retained_bytes(lambda: [parsed(f) for f in frames])
    slim, slim_bytes = retained_bytes(lambda: [kept(parsed(f)) for f in frames])
    assert slim_bytes < 0.5 * full_bytes
    for a, b in zip(full, slim, strict=True):
        assert (b.digest, b.env.digest, b.model_hash, b.plan.members, b.contributors, b.env.ts) == \
               (a.digest, a.env.digest, a.model_hash, a.plan.members, a.contributors, a.env.ts)
        assert b.updates == [] and b.partials == [] and "updates" not in b.env.body
        assert kept(b) is b
    # A round is checked against kept history exactly as against the full one.
    ledger = Ledger(tmp_path / "l.msgpack", JOB, rules_for(ids))
    for frame in frames[:2]:
        ledger.append(frame, parse_result(open_envelope(frame)))
    assert all(not r.updates for r in ledger.results)
    ledger.append(frames[2], parse_result(open_envelope(frames[2])))
    assert ledger.head == full[2].digest
    reloaded = Ledger(ledger.path, JOB, rules_for(ids))
    assert reloaded.load() == [] and reloaded.head == full[2].digest and not reloaded.results[0].updates


def test_rounds_before_the_last_few_are_held_slim_and_read_back_whole_from_the_file(tmp_path: Path) -> None:
    frames, ids = make_chain(rounds=8, members=5)
    full = verify_chain(frames, JOB, rules_for(ids))
    ledger = _filled(tmp_path / "ledger.msgpack", frames)
    old = len(frames) - WHOLE_ROUNDS
    assert [is_slim(r) for r in ledger.results] == [True] * old + [False] * WHOLE_ROUNDS
    for a, b in zip(full, ledger.results, strict=True):
        # What every round is read for, as the full result says it: the chain, the models,
        # the coordinators, the metrics, fork-choice weight, and the rows when they are listed.
        assert (b.digest, b.prev_result, b.model_hash, b.coordinator, b.metrics, b.env.ts, len(b.contributors)) == \
               (a.digest, a.prev_result, a.model_hash, a.coordinator, a.metrics, a.env.ts, len(a.contributors))
        assert list(b.contributors) == a.contributors and b.contributors == a.contributors
    assert all(isinstance(r.contributors, FrameRows) and not r.plan_frame and not r.env.raw
               for r in ledger.results[:old])
    # A slim round's plan is read back from its frame when asked for, and not kept.
    assert [r.plan.members for r in ledger.results] == [r.plan.members for r in full]
    assert not any("parsed_plan" in r.__dict__ for r in ledger.results[:old])
    assert chain_weight(ledger.results) == chain_weight(full) and ledger.weight == chain_weight(full)
    assert [result_row(r) for r in ledger.whole_results()] == [result_row(r) for r in full]
    # A check that starts in the past (a competing result, a fork) reads whole history.
    for n in range(len(frames)):
        history = ledger.history(n)
        assert not any(is_slim(r) for r in history[-WHOLE_ROUNDS:])
        verify_round(full[n], history, ledger.rules)
    # Loaded from disk: the same; the next round checks against it as before.
    again = Ledger(ledger.path, JOB, rules_for(ids))
    assert again.load() == [] and [is_slim(r) for r in again.results] == [is_slim(r) for r in ledger.results]
    assert [result_row(r) for r in again.whole_results()] == [result_row(r) for r in full]
    # Cut back to a round that was slim (another branch rewrites the file whole): the new head
    # rounds are whole again, read from the new file.
    again.replace(frames[:4])
    assert [is_slim(r) for r in again.results] == [True] + [False] * WHOLE_ROUNDS
    assert again.results[-1].plan.members == full[3].plan.members
    assert list(again.results[0].contributors) == full[0].contributors
    again.append(frames[4], parse_result(open_envelope(frames[4])))
    assert [is_slim(r) for r in again.results] == [True, True, False, False, False]


def test_a_slim_round_holds_a_small_part_of_a_kept_ones_memory(tmp_path: Path) -> None:
    frames, ids = make_chain(rounds=WHOLE_ROUNDS + 6, members=24)
    _filled(tmp_path / "ledger.msgpack", frames)
    _filled(tmp_path / "short.msgpack", frames[:WHOLE_ROUNDS])

    def loaded(name: str) -> Ledger:
        ledger = Ledger(tmp_path / name, JOB, rules_for(ids))
        assert ledger.load() == []
        return ledger

    _, short = retained_bytes(lambda: loaded("short.msgpack"))  # every round whole
    _, long = retained_bytes(lambda: loaded("ledger.msgpack"))  # six more rounds, slim
    per_whole, per_slim = short / WHOLE_ROUNDS, (long - short) / 6
    assert per_slim < 0.2 * per_whole, (per_slim, per_whole)
