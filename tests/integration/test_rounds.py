"""Six real node processes train the digits job for four rounds in groups of two."""

from __future__ import annotations

import json

import pytest

from gpuflex.node.core.ledger import Ledger, verify_chain
from mesh.blob import blob_hash
from tests.integration.conftest import digits_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def test_six_nodes_four_rounds(mesh_factory) -> None:
    mesh = mesh_factory(6)
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    job = mesh.submit(digits_spec(rounds=4, group_size=2))
    mesh.wait_job(job, list(range(6)), timeout=240)

    ledgers = []
    for i in range(6):
        ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
        assert ledger.load() == []
        ledgers.append(ledger.frames)
        verify_chain(ledger.frames, job)  # every signature and every hash link
    assert all(frames == ledgers[0] for frames in ledgers)

    rows = mesh.call(0, "ledger", {"job": job})
    assert len(rows) == 4
    assert len({r["coordinator"] for r in rows}) >= 3
    assert all(r["prev_result_hash"] == (rows[i - 1]["result_hash"] if i else "") for i, r in enumerate(rows))
    assert rows[-1]["metrics"]["accuracy"] > rows[0]["metrics"]["accuracy"]
    # groups of two with six members need a two-level tree: leaders sent signed partials
    assert any(len(r["contributors"]) == 6 for r in rows)

    hashes = {mesh.job(i, job)["model_hash"] for i in range(6)}
    assert len(hashes) == 1
    assert hashes == {rows[-1]["model_hash"]}
    # Old models are deleted as rounds commit: each node keeps the last two and the best-scored
    # round's (which `job results` hands out), not one per round.
    best = max(rows, key=lambda r: (r["metrics"]["accuracy"], r["round"]))
    for i in range(6):
        blobs = mesh.home(i) / "blobs"
        assert (blobs / rows[-1]["model_hash"]).exists() and (blobs / rows[-2]["model_hash"]).exists()
        assert (blobs / best["model_hash"]).exists()
        assert not any((blobs / r["model_hash"]).exists() for r in rows[:-2] if r is not best)


def test_int8_diloco_fragments_members_rebuild_each_model_and_results_export_to_plain_torch(mesh_factory,
                                                                                          tmp_path) -> None:
    """DiLoCo with int8 and fragments = 2: each round syncs half of the model, members train on
    from their own model, and every node rebuilds each committed model from the fragment's step."""
    import torch

    mesh = mesh_factory(3)
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    job = mesh.submit(digits_spec(rounds=2, local_epochs=0, local_steps=10, strategy="diloco", optimizer="adamw",
                                  lr=3e-3, server_lr=0.7, codec="int8", fragments=2))
    mesh.wait_job(job, [0, 1, 2], timeout=180)

    # Every node that did not commit a round rebuilt its model from the int8 step of the
    # round's fragment (an eighth of the parameters' float32 bytes, no outer momentum) instead
    # of downloading it, and all agree; each member's own model is on disk for the next round.
    rows = mesh.call(0, "ledger", {"job": job})
    for i in range(3):
        status = mesh.job(i, job)
        assert status["model_hash"] == rows[-1]["model_hash"]
        me = mesh.call(i, "status")["peer_id"]
        assert status["steps_replayed"] == sum(r["coordinator"] != me for r in rows)
        assert (mesh.home(i) / "jobs" / job / "own-model.f32").is_file()
    # The model blob holds the parameters and the outer momentum (8 bytes a parameter): an int8
    # step of the whole model is about 1 byte a parameter, of half of it about 0.5.
    params = (mesh.home(0) / "blobs" / rows[-1]["model_hash"]).stat().st_size / 8
    for row in rows:
        assert 0.4 * params < row["metrics"]["down_bytes"] < 0.6 * params
        assert all(0.4 * params < c["update_bytes"] < 0.6 * params for c in row["contributors"])
    out = tmp_path / "results"
    files = mesh.call(1, "job_results", {"job": job, "out": str(out)}, timeout=60)["files"]
    assert {p.rsplit("/", 1)[-1] for p in files} >= {"model.pt", "metrics.csv", "metrics.json", "ledger.json"}
    state = torch.load(out / "model.pt")
    assert isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values())
    assert (out / "metrics.csv").read_text().count("\n") == 3
    # model.pt is the best-scored round's model (the default final_model); the last round's
    # goes beside it when the two differ, and model.blob is the exact model model.pt holds.
    best = max(rows, key=lambda r: (r["metrics"]["accuracy"], r["round"]))
    described = json.loads((out / "job.json").read_text())
    assert described["best"] == {"round": best["round"], "model_hash": best["model_hash"]}
    assert blob_hash((out / "model.blob").read_bytes()) == best["model_hash"]
    assert (out / "last" / "model.pt").exists() == (best is not rows[-1])


def test_sparse_codec_members_rebuild_each_model_from_the_sparse_step(mesh_factory) -> None:
    """codec = "sparse" with overlap on real nodes in groups of two: updates, partials and the
    step travel sparse, members train ahead while their update travels, and every node that
    did not commit a round rebuilt its model from the step and holds the same hash as the
    others."""
    mesh = mesh_factory(4)
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    job = mesh.submit(digits_spec(rounds=3, group_size=2, local_epochs=0, local_steps=10, strategy="diloco",
                                  optimizer="adamw", lr=3e-3, server_lr=1.0, server_momentum=0.0,
                                  codec="sparse", sparse_chunk=256, sparse_density=1 / 32, sparse_bits=2,
                                  overlap=0.5))
    mesh.wait_job(job, [0, 1, 2, 3], timeout=240)

    rows = mesh.call(0, "ledger", {"job": job})
    assert len(rows) == 3
    for i in range(4):
        status = mesh.job(i, job)
        assert status["model_hash"] == rows[-1]["model_hash"]
        me = mesh.call(i, "status")["peer_id"]
        assert status["steps_replayed"] == sum(r["coordinator"] != me for r in rows)
        # what this member's top-k held back is on disk, for the next update after a restart
        assert (mesh.home(i) / "jobs" / job / "residual.f32").is_file()
    assert any(len(r["contributors"]) == 4 for r in rows)
    # overlap = 0.5: from round 3 on, members trained some steps ahead while their update
    # travelled, and their update still counts its steps within the plan's.
    ahead = [c for c in rows[2]["contributors"] if c.get("ahead_steps")]
    assert ahead and all(0 < c["ahead_steps"] < c["steps"] <= 10 for c in ahead)
    # The bytes each round moved are in the ledger and in job status: every member's signed
    # update size, and the step each member downloads, both a small share of the model.
    model_bytes = (mesh.home(0) / "blobs" / rows[-1]["model_hash"]).stat().st_size
    status = mesh.job(0, job)
    for row, m in zip(rows, status["metrics"], strict=True):
        sent = [c["update_bytes"] for c in row["contributors"]]
        assert all(0 < b < model_bytes / 10 for b in sent)
        assert m["update_bytes"] == row["metrics"]["update_bytes"] == sum(sent)
        assert 0 < m["down_bytes"] < model_bytes / 4
    assert all(0 < w["update_bytes"] < model_bytes / 10 for w in status["work"])
