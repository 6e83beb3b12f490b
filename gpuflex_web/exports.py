"""Files a job page offers (signed ledger, final model, spec) and its audit button.

The control API hands out a job's files only through ``job_results``, which writes them into a
directory. The portal asks for them into its own private cache (mode 0700, removed when the
portal stops), once per committed round, and serves or checks them from there. So the portal
and the node must share a machine, as they already share a home directory.

The audit runs ``gpuflex.audit.verify_ledger``, the very check behind ``gpuflex audit verify
--model``, on the exported ``ledger.msgpack`` and ``model.blob``: every signature, every hash
link, and the model against the last result.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from gpuflex_web import WebError
from gpuflex_web.source import NodeRefused, NodeUnavailable, Source

JOB_ID = re.compile(r"[0-9A-Za-z_-]{1,80}")
EXPORT_TIMEOUT = 120.0
#: Every file a job page may offer. A language model's results are folders (``adapter/`` or
#: ``model/``, Hugging Face layout); the portal serves each as one zip archive.
FILES = ("ledger.msgpack", "model.pt", "adapter.zip", "model.zip", "model.blob")
LLM_MODELS = ("llama", "gpt2", "pretrained")
#: What goes into each archive, beside its own folder: the base an adapter was trained on
#: (when it was built from a config and exists nowhere else) and the pinned hashes.
ARCHIVES = {"adapter.zip": ("adapter", "base", "export.json"), "model.zip": ("model", "export.json")}


class ExportError(WebError):
    """The node could not write a job's files; the message is for the user."""


class MissingFile(ExportError):
    """The job has no such file (a language model has no model.pt): not the node's fault."""


def downloads_for(job: Any, spec: Mapping[str, Any] | None) -> dict[str, str]:
    """The files the job page offers, each with an honest label: the model of the last
    committed round while the job runs, the final one once it is done; a language model's as
    the Hugging Face folder its job writes (adapter or full model), never a model.pt it lacks."""
    done = getattr(job, "state", "") == "done"
    when = "final" if done else f"round {getattr(job, 'round', 0)} of {getattr(job, 'rounds', 0)}"
    still = "" if done else " (the job is still running: this is not its final model)"
    files = {"ledger.msgpack": "the signed ledger, for gpuflex audit verify"}
    llm = spec.get("llm") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping):
        pass  # which model file this job writes is known with its spec (a moment after the page)
    elif spec.get("model") in LLM_MODELS:
        if not isinstance(llm, Mapping) or llm.get("adapter", "lora") != "none":
            files["adapter.zip"] = (f"the LoRA adapter ({when}) with its tokenizer, and base/ when the base was "
                                    f"built from a config: for PeftModel.from_pretrained{still}")
        else:
            files["model.zip"] = (f"the model ({when}) with its tokenizer: for "
                                  f"AutoModelForCausalLM.from_pretrained{still}")
    else:
        files["model.pt"] = f"the model ({when}), a torch state_dict{still}"
    files["model.blob"] = "the model bytes the ledger's hash names, for audit --model"
    return files


@dataclass(frozen=True)
class Verdict:
    ok: bool
    text: str
    rounds: int = 0
    bad_round: int | None = None


class Exporter:
    def __init__(self, source: Source, root: Path | None = None) -> None:
        self.source = source
        self.root = root or Path(tempfile.mkdtemp(prefix="gpuflex-web-"))
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        self._locks: dict[str, trio.Lock] = {}
        self._specs: dict[str, Mapping[str, Any]] = {}
        self.spec_errors: dict[str, str] = {}

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    async def export(self, job_id: str, round_: int, *, again: bool = False) -> Path:
        """The directory holding the job's files as of ``round_`` (committed rounds)."""
        if not JOB_ID.fullmatch(job_id):
            raise ExportError("not a job id")
        lock = self._locks.setdefault(job_id, trio.Lock())
        async with lock:
            job_dir = self.root / job_id
            out = job_dir / f"round-{round_}"
            if again:
                shutil.rmtree(out, ignore_errors=True)
            if not (out / "ledger.msgpack").exists():
                try:
                    await self.source.call("job_results", {"job": job_id, "out": str(out)},
                                           timeout=EXPORT_TIMEOUT)
                except NodeRefused as exc:
                    raise ExportError(str(exc)) from None
                for old in job_dir.iterdir():
                    if old != out:
                        shutil.rmtree(old, ignore_errors=True)
            spec = _read_spec(out / "job.json")
            if spec is not None:
                self._specs[job_id] = spec
            return out

    async def spec(self, job_id: str, round_: int) -> Mapping[str, Any] | None:
        """The job's spec (it never changes, so one answer is enough): from ``job_status``, or
        from an export on a node too old to send it there; a failure is kept in
        ``spec_errors`` for the page to show."""
        if job_id not in self._specs:
            try:
                spec = await self._status_spec(job_id)
                if spec is None:
                    await self.export(job_id, round_)
                else:
                    self._specs[job_id] = spec
            except (ExportError, NodeUnavailable) as exc:
                self.spec_errors[job_id] = str(exc)
                return None
        self.spec_errors.pop(job_id, None)
        return self._specs.get(job_id)

    async def _status_spec(self, job_id: str) -> Mapping[str, Any] | None:
        try:
            status = await self.source.call("job_status", {"job": job_id})
        except NodeRefused:
            return None  # a node that does not know the job (yet), or an older one
        spec = status.get("spec") if isinstance(status, Mapping) else None
        return spec if isinstance(spec, Mapping) else None

    def cached_spec(self, job_id: str) -> Mapping[str, Any] | None:
        return self._specs.get(job_id)

    async def file(self, job_id: str, round_: int, name: str) -> Path:
        if name not in FILES:
            raise MissingFile(f"no file {name!r}")
        out = await self.export(job_id, round_)
        path = out / name
        if name in ARCHIVES and not path.exists():
            folder, *more = ARCHIVES[name]
            if not (out / folder).is_dir():
                raise MissingFile(f"this job has no {folder}/ (its results hold: "
                                  f"{', '.join(sorted(p.name for p in out.iterdir()))})")
            await trio.to_thread.run_sync(_zip, out, [folder, *more], path)
        if not path.exists():
            raise MissingFile(f"this job has no {name} (its results hold: "
                              f"{', '.join(sorted(p.name for p in out.iterdir()))})")
        return path

    async def audit(self, job_id: str, round_: int) -> Verdict:
        if round_ < 1:
            return Verdict(False, "Nothing to audit yet: no round has been committed.")
        verdict = await self._audit_once(job_id, round_, again=False)
        if not verdict.ok and verdict.bad_round == round_ and "model file hash" in verdict.text:
            # A round committed while the node wrote the files: ledger and model then differ by
            # one round. One fresh export settles it; a real mismatch fails again.
            verdict = await self._audit_once(job_id, round_, again=True)
        return verdict

    async def _audit_once(self, job_id: str, round_: int, again: bool) -> Verdict:
        from gpuflex.audit import AuditError, verify_ledger

        out = await self.export(job_id, round_, again=again)
        try:
            report = await trio.to_thread.run_sync(
                verify_ledger, out / "ledger.msgpack", out / "model.blob")
        except AuditError as exc:
            return Verdict(False, f"Audit failed: {exc}", bad_round=exc.round)
        return Verdict(True, f"Chain verified: {report.rounds} rounds of job {report.job}, every "
                             f"signature and hash link checks out, and the model matches round "
                             f"{report.model_round} ({report.model_hash[:16]}…).", rounds=report.rounds)


def _zip(out: Path, names: list[str], target: Path) -> None:
    """``names`` under ``out`` (folders whole) into the zip ``target``, written atomically."""
    tmp = target.with_suffix(".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            path = out / name
            if path.is_file():
                archive.write(path, name)
            elif path.is_dir():
                for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
                    archive.write(file, file.relative_to(out).as_posix())
    tmp.replace(target)


def _read_spec(path: Path) -> Mapping[str, Any] | None:
    try:
        spec = json.loads(path.read_text()).get("spec")
    except (OSError, ValueError, AttributeError):
        return None
    return spec if isinstance(spec, Mapping) else None
