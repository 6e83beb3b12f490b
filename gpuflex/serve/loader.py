"""Loading the models the operator allows, and nothing else.

- ``job``: a job this node took part in, finished. Its committed model is exported from the
  blob the ledger's last ``model_hash`` names (the hash is checked on the bytes read), the
  same way ``gpuflex job results`` writes it; a LoRA adapter is loaded on the base the job
  pinned, whose weights must hash to the job's ``base_hash``, and merged into it for speed.
- ``path``: a local Hugging Face directory the operator named in ``[serve.models]``.

Always ``local_files_only``, safetensors only, never ``trust_remote_code``; no path comes
from a peer. The served hash is the ledger's model hash for a job, the weights' content hash
for a directory: what the node announces, so a client can tell two servers hold the same model.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflex.serve import ServeError
from gpuflex.serve.settings import ModelEntry, SourceKind


@dataclass
class LoadedModel:
    name: str
    model_hash: str
    source: str  # "job <id>" or the directory, for status
    model: Any
    tokenizer: Any
    eos_id: int | None


def load_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ServeError(f"cannot load the tokenizer in {directory}: {str(exc).splitlines()[0]}") from None


def _eos(tokenizer: Any, model: Any) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    return int(eos) if isinstance(eos, int) else None


def load_directory(name: str, directory: Path, source: str, model_hash: str | None = None) -> LoadedModel:
    """A causal LM and its tokenizer from a local directory (safetensors, no remote code)."""
    from gpuflex.ml.llm import LLMError
    from gpuflex.ml.llm.models import base_hash, load_pretrained

    if not directory.is_dir():
        raise ServeError(f"model {name!r}: {directory} is not a directory")
    try:
        model = load_pretrained(directory)
    except LLMError as exc:
        raise ServeError(f"model {name!r}: {exc}") from None
    tok = load_tokenizer(directory)
    model.config.use_cache = True  # type: ignore[union-attr]
    return LoadedModel(name, model_hash or base_hash(model), source, model.eval(), tok, _eos(tok, model))


def load_exported(name: str, out: Path, model_hash: str) -> LoadedModel:
    """A job's exported result (``gpuflex.ml.llm.export``): ``model/``, or ``adapter/`` on
    the pinned base, after checking the exported blob against the ledger's hash."""
    import blake3

    from gpuflex.ml.llm.models import base_hash

    blob = out / "model.blob"
    digest = blake3.blake3(blob.read_bytes()).hexdigest() if blob.is_file() else ""
    if digest != model_hash:
        raise ServeError(f"model {name!r}: the exported model hashes to {digest[:16]}…, the ledger says "
                         f"{model_hash[:16]}…; not serving it")
    try:
        meta = json.loads((out / "export.json").read_text())
    except (OSError, ValueError):
        raise ServeError(f"model {name!r}: the job's export has no export.json (not a language-model job?)") from None
    if (out / "model").is_dir():
        return load_directory(name, out / "model", f"job {out.name}", model_hash)
    base = load_directory(name, Path(meta["base_dir"]), f"job {out.name}", model_hash)
    if base_hash(base.model) != meta.get("base_hash"):
        raise ServeError(f"model {name!r}: the base in {meta['base_dir']} is not the one the job pinned")
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = PeftModel.from_pretrained(base.model, str(out / "adapter")).merge_and_unload()
    merged.config.use_cache = True
    base.model = merged.eval()
    base.tokenizer = load_tokenizer(out / "adapter")
    return base


def describe(entry: ModelEntry) -> str:
    return f"job {entry.job}" if entry.kind is SourceKind.JOB else str(entry.path)
