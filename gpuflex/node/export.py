"""Writing a job's outcome for people and tools that never talk to the mesh."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpuflex.llmspec import is_llm
from gpuflex.node.core.ledgerfile import export_bytes
from gpuflex.node.core.messages import Result
from gpuflex.node.core.modelblob import unpack_model
from gpuflex.node.core.selection import best_result
from gpuflex.plot import plot_metrics
from mesh.fsutil import atomic_write, atomic_write_text

METRIC_COLUMNS = ("round", "loss", "accuracy", "perplexity", "train_loss", "contributors", "duration_s",
                  "update_bytes", "down_bytes")


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
    #: The best-scored round's model (gpuflex.node.core.selection), when it is not the last one.
    best_hash: str = ""
    best_round: int = 0
    read_best: Callable[[], bytes] | None = None


def job_export(job_id: str, spec: Any, head: str, results: Sequence[Result], blobs: Any, trainer: ModelWriter,
               metrics: list[dict[str, Any]], ledger: list[dict[str, Any]], ledger_path: Path) -> JobExport:
    """A job's outcome as its node holds it now: the head model, and the best-scored round's
    (``gpuflex.node.core.selection``) while the node still keeps its blob."""
    best = best_result(results)
    best_hash = best.model_hash if best is not None and blobs.has(best.model_hash) else ""
    return JobExport(job_id=job_id, spec=spec, model_hash=head, read_model=lambda: blobs.read(head),
                     trainer=trainer, metrics=metrics, ledger=ledger, ledger_path=ledger_path,
                     best_hash=best_hash, best_round=best.round if best is not None else 0,
                     read_best=lambda: blobs.read(best_hash))


def _write_model(job: JobExport, blob: bytes, out: Path) -> list[Path]:
    """One committed model: the workload's files and the exact blob the ledger's hash names."""
    out.mkdir(parents=True, exist_ok=True)
    params, _ = unpack_model(blob)
    files = job.trainer.export_model(params, out)
    del params
    # The exact bytes the ledger names, for `gpuflex audit verify --model`.
    atomic_write(out / "model.blob", blob, mode=0o644)
    files.append(out / "model.blob")
    return files


def export_results(job: JobExport, out: Path) -> list[Path]:
    """The job's model, metrics (CSV, JSON and a PNG plot) and the ledger.

    The workload writes the model: a plain torch state_dict, or for a language model the
    Hugging Face directories (gpuflex/ml/llm/export.py). ``model.pt`` is the model the job's
    ``final_model`` selects, the best-scored round's or the last one's; when the two differ
    the other one goes to ``last/`` or ``best/`` (classic models only: a language model's
    export is the size of the model, so it writes the selected one alone).

    MLflow export reads these files (``gpuflex.tracking``), so there is one writer of results.
    """
    out.mkdir(parents=True, exist_ok=True)
    has_best = bool(job.best_hash) and job.best_hash != job.model_hash and job.read_best is not None
    pick_best = has_best and getattr(job.spec, "final_model", "last") == "best"
    files = _write_model(job, job.read_best() if pick_best and job.read_best else job.read_model(), out)
    if has_best and not is_llm(job.spec.model):
        other = job.read_model if pick_best else job.read_best
        assert other is not None
        files += _write_model(job, other(), out / ("last" if pick_best else "best"))
    rows = job.metrics
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    for name, text in (("metrics.csv", buf.getvalue()), ("metrics.json", json.dumps(rows, indent=2)),
                       ("ledger.json", json.dumps(job.ledger, indent=2)),
                       ("job.json", json.dumps({"job_id": job.job_id, "spec": job.spec.to_dict(),
                                                "model_hash": job.model_hash,
                                                "best": {"round": job.best_round,
                                                         "model_hash": job.best_hash or job.model_hash},
                                                "model_pt": "best" if pick_best else "last"},
                                               indent=2))):
        atomic_write_text(out / name, text, mode=0o644)
        files.append(out / name)
    atomic_write(out / "ledger.msgpack", export_bytes(job.ledger_path, job.job_id), mode=0o644)
    files.append(out / "ledger.msgpack")
    plot = plot_metrics(rows, out / "metrics.png", title=f"job {job.job_id} ({job.spec.name})")
    if plot is not None:
        files.append(plot)
    return files
