"""The fragment-wise outer sync (job option ``fragments``): the job file's rules, the root's
step on one fragment and every member's replay of it, a member's own model across rounds,
and rounds on the fake transport with the real drivers and roles."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregation.fragments import round_span, synced_since
from gpuflex.jobspec import JobSpec, JobSpecError
from gpuflex.node import ownmodel
from gpuflex.node.core.modelblob import pack_model, unpack_model
from gpuflex.node.core.outerstep import outer_step, replay_step
from gpuflex.node.core.pipeline import DeltaEncoder, decode_payload
from gpuflex.node.ownmodel import OWN_MODEL_FILE, OwnModel
from mesh.blob import blob_hash
from mesh.codec import WireError
from tests.unit.node import fakenet
from tests.unit.node.fakenet import FakeNet, fast_spec

BASE = {"model": "mlp", "data": "sklearn-digits", "strategy": "diloco", "local_epochs": 0, "local_steps": 5}


def job(**overrides: object) -> JobSpec:
    return JobSpec.from_dict({**BASE, **overrides})


def refusal(**overrides: object) -> str:
    with pytest.raises(JobSpecError) as info:
        job(**overrides)
    return str(info.value)


# -- the job file ------------------------------------------------------------------------------

def test_the_job_file_bounds_fragments_and_defaults_to_the_whole_model() -> None:
    assert job().fragments == 1 and job(fragments=64).fragments == 64
    for bad in (0, 65, 2.5, "4", True):
        assert "fragments: must be an integer from 1 to 64" in refusal(fragments=bad)


def test_the_job_file_refuses_fragments_without_diloco() -> None:
    for strategy in ("fedavg", "fedavgm", "fedadam"):
        assert "fragments: needs strategy = 'diloco'" in refusal(fragments=4, strategy=strategy)
    assert job(strategy="fedavg", fragments=1).fragments == 1


def test_the_job_file_refuses_fragments_with_scaffold() -> None:
    assert "fragments: cannot be combined with drift_correction = 'scaffold'" in refusal(
        fragments=4, drift_correction="scaffold")


# -- the root's step and every member's replay -------------------------------------------------

CODECS = {"none": {}, "fp16": {}, "int8": {}, "topk": {}, "sparse": {"sparse_chunk": 64, "sparse_density": 1 / 8}}


@settings(max_examples=40, deadline=None)
@given(codec=st.sampled_from(sorted(CODECS)), fragments=st.integers(min_value=2, max_value=9),
       rounds=st.integers(min_value=1, max_value=12), size=st.integers(min_value=40, max_value=700))
def test_members_rebuild_every_fragment_step_bit_for_bit_and_only_its_fragment_moves(
        codec, fragments, rounds, size) -> None:
    spec = job(fragments=fragments, codec=codec, server_lr=0.7, server_momentum=0.9, **CODECS[codec])
    rng = np.random.default_rng(size + 7 * fragments + rounds)
    root = member = pack_model(rng.normal(size=size).astype(np.float32), {})
    for r in range(1, rounds + 1):
        span = round_span(size, fragments, r)
        avg = rng.normal(size=span.length).astype(np.float32) * 0.1
        before, before_state = unpack_model(root)
        params, state, step = outer_step(spec, before, before_state, avg, r)
        assert step is not None, "a fragment's step always travels instead of the model"
        assert len(step) < 4 * span.length + 256, "and it is the fragment's size (with its header)"
        outside = np.ones(size, dtype=bool)
        outside[span.start:span.stop] = False
        assert np.array_equal(params[outside], before[outside])
        for key, value in state.items():
            assert value.size == size
            if key in before_state:
                assert np.array_equal(value[outside], before_state[key][outside]), "momentum is per fragment"
            else:
                assert not value[outside].any()
        root = pack_model(params, state)
        member = pack_model(*replay_step(spec, *unpack_model(member), step, r))
        assert blob_hash(member) == blob_hash(root), f"round {r}: the member's model is the root's"


def test_fragment_steps_with_plain_averaging_add_each_fragments_average_in_turn() -> None:
    spec = job(fragments=4, server_lr=1.0, server_momentum=0.0)
    size = 103
    params = np.linspace(-1, 1, size, dtype=np.float32)
    expected, state = params.copy(), {}
    for r in range(1, 9):
        span = round_span(size, 4, r)
        avg = np.full(span.length, float(r), np.float32)
        params, state, _ = outer_step(spec, params, state, avg, r)
        expected[span.start:span.stop] += np.float32(r)
    np.testing.assert_array_equal(params, expected)


def test_outer_momentum_of_a_fragment_moves_only_when_it_syncs() -> None:
    """DiLoCo's Nesterov momentum on a fragment is the optimizer applied to that fragment
    alone, however many rounds synced the others in between."""
    whole = job(server_lr=0.7, server_momentum=0.9)
    spec = dataclasses.replace(whole, fragments=3)
    size = 30
    params, state = np.zeros(size, np.float32), {}
    alone, alone_state = np.zeros(10, np.float32), {}
    for r in range(1, 10):
        span = round_span(size, 3, r)
        avg = np.full(span.length, 0.5 + r, np.float32)
        params, state, _ = outer_step(spec, params, state, avg, r)
        if span.start == 0:
            alone, alone_state, _ = outer_step(whole, alone, alone_state, avg, 1)
    np.testing.assert_array_equal(params[:10], alone)


def test_a_step_of_the_wrong_fragment_size_is_a_wire_error() -> None:
    spec = job(fragments=4, codec="int8")
    params = np.ones(100, np.float32)
    _, _, step = outer_step(dataclasses.replace(spec, fragments=1), params, {}, np.ones(100, np.float32), 1)
    assert step is not None
    with pytest.raises(WireError, match="round 1's fragment 25"):
        replay_step(spec, params, {}, step, 1)


def test_a_member_sends_its_fragment_with_the_residual_of_that_fragment_alone(tmp_path) -> None:
    spec = job(fragments=2, codec="int8")
    encoder = DeltaEncoder(spec, residual_path=tmp_path / "residual.f32")
    for r in (1, 2, 3):
        span = round_span(100, 2, r)
        payload = encoder.encode(np.full(span.length, 0.3, np.float32), 1, span=span)
        assert decode_payload(spec, payload, span.length).size == 50
        assert encoder.feedback is not None and encoder.feedback.residual is not None
        assert encoder.feedback.residual.size == 100, "the residual stays model-sized"
    restored = DeltaEncoder(spec, residual_path=tmp_path / "residual.f32")
    assert restored.feedback is not None and np.array_equal(restored.feedback.residual, encoder.feedback.residual)


# -- a member's own model ----------------------------------------------------------------------

def plan(round_: int, base: str) -> SimpleNamespace:
    return SimpleNamespace(round=round_, base_hash=base)


def chain(*links: tuple[str, str]) -> list[SimpleNamespace]:
    """Results of rounds 1.. as (base hash, model hash)."""
    return [SimpleNamespace(base_hash=b, model_hash=m) for b, m in links]


def test_a_member_carries_its_own_model_on_and_takes_the_synced_fragment_from_the_mesh(tmp_path) -> None:
    path = tmp_path / OWN_MODEL_FILE
    own = OwnModel(path, 2)
    committed0, committed1 = np.zeros(10, np.float32), np.full(10, 5.0, np.float32)
    assert np.array_equal(own.start_for(plan(1, "m0"), [], committed0), committed0), "none yet: the committed model"
    trained = np.arange(10, dtype=np.float32)
    own.keep(plan(1, "m0"), trained)
    update, span = own.update(1, committed0, trained)
    assert (span.start, span.stop) == (0, 5) and np.array_equal(update, trained[:5])
    # Round 1 synced fragment 0: round 2 starts from the own model with fragment 0 the mesh's.
    start = OwnModel(path, 2).start_for(plan(2, "m1"), chain(("m0", "m1")), committed1)  # after a restart too
    assert np.array_equal(start, np.r_[committed1[:5], trained[5:]])


def test_a_retried_round_trains_from_the_same_start(tmp_path) -> None:
    own = OwnModel(tmp_path / OWN_MODEL_FILE, 2)
    own.keep(plan(1, "m0"), np.ones(4, np.float32))
    first = own.start_for(plan(2, "m1"), chain(("m0", "m1")), np.zeros(4, np.float32))
    own.keep(plan(2, "m1"), np.full(4, 9.0, np.float32))  # the first attempt's training ended
    again = own.start_for(plan(2, "m1"), chain(("m0", "m1")), np.zeros(4, np.float32))
    assert np.array_equal(first, again)


@pytest.mark.parametrize("why, own_round, results, plan_base", [
    ("the ledger continued from another base (another branch)", 1, chain(("other", "m1")), "m1"),
    ("the plan builds on another model than this ledger's head", 1, chain(("m0", "m1")), "elsewhere"),
    ("trained for this round already, by an attempt on another base", 2, chain(("m0", "m1")), "m1"),
    ("this ledger does not reach the round it was trained in", 3, chain(("m0", "m1")), "m1"),
])
def test_a_member_falls_back_to_the_committed_model(tmp_path, why, own_round, results, plan_base) -> None:
    own = OwnModel(tmp_path / OWN_MODEL_FILE, 2)
    own.keep(plan(own_round, "m0"), np.ones(4, np.float32))
    committed = np.zeros(4, np.float32)
    assert np.array_equal(OwnModel(tmp_path / OWN_MODEL_FILE, 2).start_for(plan(2, plan_base), results, committed),
                          committed), why


def test_a_damaged_own_model_file_means_the_committed_model(tmp_path) -> None:
    path = tmp_path / OWN_MODEL_FILE
    for junk in (b"", b"{not json}\n\x00\x00\x00\x00", b'{"round": 1, "base": "m0"}\n\x00\x00', b"x" * 600):
        path.write_bytes(junk)
        committed = np.zeros(4, np.float32)
        assert np.array_equal(OwnModel(path, 2).start_for(plan(2, "m1"), chain(("m0", "m1")), committed), committed)


def test_a_member_two_rounds_behind_takes_both_synced_fragments(tmp_path) -> None:
    own = OwnModel(tmp_path / OWN_MODEL_FILE, 3)
    own.keep(plan(1, "m0"), np.full(9, 7.0, np.float32))
    committed = np.zeros(9, np.float32)
    start = own.start_for(plan(3, "m2"), chain(("m0", "m1"), ("m1", "m2")), committed)
    assert np.array_equal(start, np.r_[np.zeros(6), np.full(3, 7.0)]), "fragments 0 and 1 synced since"


# -- rounds on the fake transport --------------------------------------------------------------

def moved_only_in_their_fragment(net: FakeNet, results: list, fragments: int) -> list:
    """Each committed model differs from the one before it inside its round's fragment only;
    the rounds' spans."""
    node, previous, spans = net.alive_nodes()[0], fakenet.FakeTrainer(0).initial_params(), []
    for r in range(1, len(results) + 1):
        model = net.committed_model(node, r)
        span = round_span(model.size, fragments, r)
        moved = np.flatnonzero(model != previous)
        assert moved.size and span.start <= moved.min() and moved.max() < span.stop, f"round {r} moved outside"
        previous = model
        spans.append(span)
    return spans


async def test_fragment_rounds_commit_one_fragment_each_and_every_member_replays_them(
        autojump_clock, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(fakenet, "DIM", 3_000)
    rounds, fragments = 4, 3
    spec = fast_spec(rounds=rounds, min_nodes=4, strategy="diloco", server_lr=0.7, server_momentum=0.9,
                     codec="int8", fragments=fragments, overlap=0.5, local_epochs=0, local_steps=4)
    merged: list[tuple[int, int]] = []  # (first, last) round synced into an own model

    def spy(local, committed, count, first, last):
        merged.append((first, last))
        return synced_since(local, committed, count, first, last)

    monkeypatch.setattr(ownmodel, "synced_since", spy)
    net = FakeNet(tmp_path, 4, spec)
    results = await net.run_rounds(rounds)
    nodes = net.alive_nodes()
    for r, (res, span) in enumerate(zip(results, moved_only_in_their_fragment(net, results, fragments),
                                        strict=True), start=1):
        assert 0 < res.metrics["down_bytes"] < 1.5 * span.length, f"round {r}: the step is the fragment's int8"
        assert all(c["update_bytes"] < 1.5 * span.length for c in res.contributors)
    for node in nodes:
        book = node.driver.book
        assert book.head_model == results[-1].model_hash
        assert book.status.steps_replayed == sum(res.coordinator != node.peer_id for res in results)
        assert (book.dir / OWN_MODEL_FILE).is_file()
    # Every member trained every round after the first from its own model, the fragment synced
    # last round taken from the mesh: none fell back to the committed model.
    assert sorted(merged) == sorted((r - 1, r - 1) for r in range(2, rounds + 1) for _ in nodes)


async def test_secure_aggregation_masks_the_fragment_a_round_syncs(autojump_clock, tmp_path, monkeypatch) -> None:
    """Masks are drawn for the update's own size, so a masked fragment sums like a masked model."""
    monkeypatch.setattr(fakenet, "DIM", 300)
    rounds, fragments = 3, 3
    spec = fast_spec(rounds=rounds, min_nodes=4, strategy="diloco", server_lr=1.0, server_momentum=0.0,
                     fragments=fragments, secure_aggregation=True, secagg_min_group=2, local_epochs=0,
                     local_steps=3)
    net = FakeNet(tmp_path, 5, spec)
    results = await net.run_rounds(rounds)
    moved_only_in_their_fragment(net, results, fragments)
    for res in results:
        groups = res.env.body["secagg"]
        assert groups and all(g["recovered"] for g in groups), "the round's groups were masked"
    assert {n.driver.book.head_model for n in net.alive_nodes()} == {results[-1].model_hash}
