"""Tracking export: a finished job's results, in the experiment tracker people already use.

The plain export always works and needs nothing: ``gpuflex job results`` (``export.py``)
writes ``metrics.csv``, ``metrics.json``, ``metrics.png``, ``job.json`` and ``model.pt``.
MLflow is optional (``pip install 'gpuflex[mlflow]'``) and reads *those files*, not the node,
so a job exported yesterday, or on another machine, can be logged later, and the node never
imports MLflow. Each job becomes one run: the job spec as parameters, every round's metrics
with ``step = round``, and the final model and the files beside it as artifacts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuflex.errors import GpuflexError

ROUND_METRICS = ("loss", "accuracy", "train_loss", "contributors", "duration_s")
ARTIFACTS = ("metrics.csv", "metrics.json", "metrics.png", "ledger.json", "job.json")
MLFLOW_PARAM_MAX = 6000


class TrackingError(GpuflexError, RuntimeError):
    """The results folder is incomplete, or the tracker is not installed."""


def load_results(results_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(job, metric rows)`` from a folder written by ``gpuflex job results``."""
    root = Path(results_dir)
    try:
        job = json.loads((root / "job.json").read_text())
        rows = json.loads((root / "metrics.json").read_text())
    except FileNotFoundError as exc:
        raise TrackingError(f"{root} is not a results folder (missing {Path(str(exc.filename)).name}); "
                            "write one with 'gpuflex job results JOB --out DIR'") from None
    except ValueError as exc:
        raise TrackingError(f"{root}: unreadable results ({exc})") from None
    return job, rows


def _is_file_store(uri: str) -> bool:
    return uri.startswith("file:") or ("://" not in uri and not uri.startswith(("databricks", "sqlite")))


def export_mlflow(results_dir: str | os.PathLike[str], tracking_uri: str, experiment: str = "gpuflex",
                  run_name: str | None = None) -> str:
    """Log one job to MLflow and return the run id.

    A ``file:`` URI (or a plain folder) is a local file store with no server. MLflow 3 keeps
    that backend in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``; naming a file store
    here is the user's explicit choice, so the flag is set for it.
    """
    try:
        from mlflow import MlflowClient
    except ImportError:
        raise TrackingError("MLflow export needs the optional extra: pip install 'gpuflex[mlflow]'") from None
    root = Path(results_dir)
    job, rows = load_results(root)
    if _is_file_store(tracking_uri):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    spec = job.get("spec") or {}
    run = client.create_run(experiment_id, run_name=run_name or f"{spec.get('name', 'job')}-{job['job_id']}",
                            tags={"gpuflex.job_id": str(job["job_id"]),
                                  "gpuflex.model_hash": str(job.get("model_hash", ""))})
    run_id = run.info.run_id
    try:
        for key, value in sorted(spec.items()):
            text = value if isinstance(value, str) else json.dumps(value)
            client.log_param(run_id, key, text[:MLFLOW_PARAM_MAX])
        for row in rows:
            for key in ROUND_METRICS:
                value = row.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    client.log_metric(run_id, key, float(value), step=int(row["round"]))
        if (root / "model.pt").exists():
            client.log_artifact(run_id, str(root / "model.pt"), artifact_path="model")
        for name in ARTIFACTS:
            if (root / name).exists():
                client.log_artifact(run_id, str(root / name), artifact_path="results")
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id)
    return run_id


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuflex.tracking RESULTS_DIR --mlflow URI``: log an exported job to MLflow."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpuflex.tracking", description=main.__doc__)
    parser.add_argument("results", help="a folder written by 'gpuflex job results'")
    parser.add_argument("--mlflow", required=True, metavar="URI", help="tracking URI, e.g. file:./mlruns")
    parser.add_argument("--experiment", default="gpuflex")
    args = parser.parse_args(argv)
    try:
        run_id = export_mlflow(args.results, args.mlflow, experiment=args.experiment)
    except TrackingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(run_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
