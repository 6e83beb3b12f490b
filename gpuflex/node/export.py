"""Writing a job's outcome for people and tools that never talk to the mesh."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflex.node.modelblob import unpack_model
from gpuflex.plot import plot_metrics
from mesh.fsutil import atomic_write, atomic_write_text

if TYPE_CHECKING:
    from gpuflex.node.rounds import JobRunner

METRIC_COLUMNS = ("round", "loss", "accuracy", "train_loss", "contributors", "duration_s")


def export_results(runner: JobRunner, out: Path) -> list[Path]:
    """Final model, metrics (CSV, JSON and a PNG plot) and the ledger.

    The workload writes the model: a plain torch state_dict, or for a language model the
    Hugging Face directories (gpuflex/ml/llm/export.py).

    MLflow export reads these files (``gpuflex.tracking``), so there is one writer of results.
    """
    out.mkdir(parents=True, exist_ok=True)
    blob = runner.mesh.blobs.read(runner.head_model)
    params, _ = unpack_model(blob)
    files = runner.workload.export_model(params, out)
    del params
    # The exact bytes the ledger's model_hash names, for `gpuflex audit verify --model`.
    atomic_write(out / "model.blob", blob, mode=0o644)
    files.append(out / "model.blob")
    rows = runner.summary()["metrics"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    for name, text in (("metrics.csv", buf.getvalue()), ("metrics.json", json.dumps(rows, indent=2)),
                       ("ledger.json", json.dumps(runner.ledger_rows(), indent=2)),
                       ("job.json", json.dumps({"job_id": runner.job_id, "spec": runner.spec.to_dict(),
                                                "model_hash": runner.head_model}, indent=2))):
        atomic_write_text(out / name, text, mode=0o644)
        files.append(out / name)
    atomic_write(out / "ledger.msgpack", runner.ledger.path.read_bytes() if runner.ledger.path.exists() else b"",
                 mode=0o644)
    files.append(out / "ledger.msgpack")
    plot = plot_metrics(rows, out / "metrics.png", title=f"job {runner.job_id} ({runner.spec.name})")
    if plot is not None:
        files.append(plot)
    return files
