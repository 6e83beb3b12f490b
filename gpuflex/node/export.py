"""Writing a job's outcome for people and tools that never talk to the mesh."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpuflex.node.modelblob import unpack_model
from gpuflex.plot import plot_metrics
from mesh.fsutil import atomic_write, atomic_write_text

METRIC_COLUMNS = ("round", "loss", "accuracy", "perplexity", "train_loss", "contributors", "duration_s",
                  "update_bytes", "sent_bytes")


class ModelWriter(Protocol):
    def export_model(self, params: np.ndarray, out: Path) -> list[Path]:
        """Write the final model in the format its ecosystem loads; the files written."""
        ...


@dataclass(frozen=True)
class JobExport:
    """A job's outcome as taken on its node; ``export_results`` reads it in a worker thread."""

    job_id: str
    spec: Any  # JobSpec
    model_hash: str
    read_model: Callable[[], bytes]  # the exact bytes the ledger's model_hash names
    trainer: ModelWriter
    metrics: list[dict[str, Any]]
    ledger: list[dict[str, Any]]
    ledger_path: Path  # the signed ledger as stored


def export_results(job: JobExport, out: Path) -> list[Path]:
    """Final model, metrics (CSV, JSON and a PNG plot) and the ledger.

    The workload writes the model: a plain torch state_dict, or for a language model the
    Hugging Face directories (gpuflex/ml/llm/export.py).

    MLflow export reads these files (``gpuflex.tracking``), so there is one writer of results.
    """
    out.mkdir(parents=True, exist_ok=True)
    blob = job.read_model()
    params, _ = unpack_model(blob)
    files = job.trainer.export_model(params, out)
    del params
    # The exact bytes the ledger's model_hash names, for `gpuflex audit verify --model`.
    atomic_write(out / "model.blob", blob, mode=0o644)
    files.append(out / "model.blob")
    rows = job.metrics
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    for name, text in (("metrics.csv", buf.getvalue()), ("metrics.json", json.dumps(rows, indent=2)),
                       ("ledger.json", json.dumps(job.ledger, indent=2)),
                       ("job.json", json.dumps({"job_id": job.job_id, "spec": job.spec.to_dict(),
                                                "model_hash": job.model_hash}, indent=2))):
        atomic_write_text(out / name, text, mode=0o644)
        files.append(out / name)
    atomic_write(out / "ledger.msgpack", job.ledger_path.read_bytes() if job.ledger_path.exists() else b"",
                 mode=0o644)
    files.append(out / "ledger.msgpack")
    plot = plot_metrics(rows, out / "metrics.png", title=f"job {job.job_id} ({job.spec.name})")
    if plot is not None:
        files.append(plot)
    return files
