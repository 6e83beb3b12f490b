"""The PNG plot and the MLflow export, on a results folder like ``gpuflex job results`` writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuflex.plot import plot_metrics
from gpuflex.tracking import TrackingError, export_mlflow, load_results

ROWS = [{"round": r, "loss": 1.0 / r, "accuracy": 0.5 + 0.1 * r, "train_loss": 1.2 / r, "contributors": 3,
         "duration_s": 0.4} for r in (1, 2, 3)]


def results_folder(root: Path) -> Path:
    import torch

    root.mkdir()
    (root / "metrics.json").write_text(json.dumps(ROWS))
    (root / "job.json").write_text(json.dumps({"job_id": "abc123", "model_hash": "ff" * 8,
                                               "spec": {"name": "digits", "rounds": 3, "lr": 0.05,
                                                        "allowlist": []}}))
    torch.save({"w": torch.ones(2)}, root / "model.pt")
    plot_metrics(ROWS, root / "metrics.png")
    return root


def test_plot_is_a_png(tmp_path) -> None:
    out = plot_metrics(ROWS, tmp_path / "m.png", title="job abc")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_metrics([], tmp_path / "empty.png") is None and not (tmp_path / "empty.png").exists()


def test_a_job_name_is_drawn_as_text_not_parsed_as_mathtext(tmp_path) -> None:
    out = plot_metrics(ROWS, tmp_path / "m.png", title="job <script> [/evil] $\\x$")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_results_say_how_to_make_them(tmp_path) -> None:
    with pytest.raises(TrackingError, match="gpuflex job results"):
        load_results(tmp_path)


def test_mlflow_export_writes_a_run_to_a_file_store(tmp_path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    run_id = export_mlflow(results_folder(tmp_path / "results"), uri, experiment="gpuflex-test")
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rounds"] == "3" and run.data.params["name"] == "digits"
    assert run.data.tags["gpuflex.job_id"] == "abc123"
    history = client.get_metric_history(run_id, "accuracy")
    assert [(m.step, round(m.value, 3)) for m in history] == [(1, 0.6), (2, 0.7), (3, 0.8)]
    assert [a.path for a in client.list_artifacts(run_id, "model")] == ["model/model.pt"]
    assert {a.path for a in client.list_artifacts(run_id, "results")} >= {"results/metrics.png",
                                                                          "results/metrics.json"}


def test_tracking_command_line(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("mlflow")
    from gpuflex.tracking import main

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    assert main([str(results_folder(tmp_path / "results")), "--mlflow", uri]) == 0
    assert len(capsys.readouterr().out.strip()) == 32  # the run id
    assert main([str(tmp_path / "nowhere"), "--mlflow", uri]) == 1
    assert "not a results folder" in capsys.readouterr().err
