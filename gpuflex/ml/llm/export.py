"""Results that the Hugging Face ecosystem loads as they are, all in safetensors.

- A full fine-tune writes ``model/``: ``AutoModelForCausalLM.from_pretrained("model")``.
- A LoRA job writes ``adapter/``: ``PeftModel.from_pretrained(base, "adapter")``. For a model
  built from a config the base exists nowhere else, so it is written too, as ``base/``; for
  a pretrained model the adapter names the operator's directory it was trained on.
- The tokenizer is saved beside each (``AutoTokenizer.from_pretrained`` on the same folder).

``export.json`` records the base and tokenizer hashes that the job pinned, so anyone can tell
which base an adapter belongs to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from gpuflex.ml.llm import LLMError
from gpuflex.ml.llm.models import base_hash, build_base
from gpuflex.ml.llm.tokenizer import eos_id, save_hf_tokenizer
from mesh.fsutil import atomic_write_text


class ExportSource(Protocol):
    """What the export reads of a language-model workload (``workload.LLMWorkload``); named
    here so that the workload may call the export without the two importing each other."""

    spec: Any
    settings: dict[str, Any]
    base_hash: str
    tokenizer_hash: str

    @property
    def num_params(self) -> int: ...
    model: Any
    tokenizer: Any
    config: Any


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file())


def export_llm(work: ExportSource, out: Path) -> list[Path]:
    """Write the model (or adapter, and base) with its tokenizer under ``out``; the
    workload's model must already hold the parameters to export."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a node's log is no terminal
    spec, settings = work.spec, work.settings
    out.mkdir(parents=True, exist_ok=True)
    max_len = settings["seq_len"]
    files: list[Path] = []
    info = {"model": spec.model, "adapter": settings["adapter"], "base_hash": work.base_hash,
            "tokenizer_hash": work.tokenizer_hash, "trainable_parameters": work.num_params}
    if settings["adapter"] == "none":
        target = out / "model"
        work.model.save_pretrained(str(target), safe_serialization=True)
        save_hf_tokenizer(work.tokenizer, target, max_len)
        files += _files(target)
        info["load"] = "AutoModelForCausalLM.from_pretrained('model')"
    else:
        if spec.model == "pretrained":
            base_dir = work.config.model_dir(settings["pretrained"])
        else:
            base_dir = out / "base"
            base: Any = build_base(spec, work.config, work.tokenizer.get_vocab_size(), eos_id(work.tokenizer))
            if base_hash(base) != work.base_hash:
                raise LLMError("the rebuilt base does not match the job's base hash; not exporting it")
            base.save_pretrained(str(base_dir), safe_serialization=True)
            save_hf_tokenizer(work.tokenizer, base_dir, max_len)
            files += _files(base_dir)
            del base
        target = out / "adapter"
        work.model.peft_config["default"].base_model_name_or_path = str(base_dir)
        work.model.save_pretrained(str(target), safe_serialization=True)
        save_hf_tokenizer(work.tokenizer, target, max_len)
        files += _files(target)
        info["base_dir"] = str(base_dir)
        info["load"] = "PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), 'adapter')"
    atomic_write_text(out / "export.json", json.dumps(info, indent=2), mode=0o644)
    files.append(out / "export.json")
    return files
