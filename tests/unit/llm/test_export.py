"""`gpuflex job results` for language models: directories that transformers and peft load
as they are, in safetensors, with the tokenizer beside them, and that generate text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from gpuflex.ml.llm.pin import pin_llm_spec
from gpuflex.ml.llm.workload import LLMWorkload

from .conftest import tiny_spec


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_full_fine_tune_exports_a_model_dir_that_from_pretrained_loads(home: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = LLMWorkload(pin_llm_spec(tiny_spec("gpt2", adapter="none"), home), 0, 1, home)
    params = work.initial_params()
    params = params + work.train(params)[0]
    files = work.export_model(params, tmp_path)
    assert (tmp_path / "model" / "model.safetensors") in files
    assert not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.pt"))
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    ids = tok("First Citizen:\n", return_tensors="pt").input_ids
    assert torch.allclose(_logits(model, ids), _logits(work.model, ids), atol=1e-5)
    out = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4)


def test_a_lora_job_exports_an_adapter_that_peft_loads_on_the_same_base(home: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = LLMWorkload(pin_llm_spec(tiny_spec(), home), 0, 1, home)
    params = work.initial_params()
    params = params + 10 * work.train(params)[0]  # a clearly non-zero adapter
    work.export_model(params, tmp_path)
    meta = json.loads((tmp_path / "export.json").read_text())
    assert meta["adapter"] == "lora" and meta["base_hash"] == work.base_hash
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    tok = AutoTokenizer.from_pretrained(tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    ids = tok("All:\nSpeak", return_tensors="pt").input_ids
    plain = _logits(base, ids)
    model = PeftModel.from_pretrained(base, tmp_path / "adapter")
    tuned = _logits(model, ids)
    assert torch.allclose(tuned, _logits(work.model, ids), atol=1e-5)
    assert not torch.allclose(tuned, plain, atol=1e-4)  # the adapter is really applied
    out = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4) and isinstance(tok.decode(out[0]), str)
    assert np.isfinite(work.evaluate(params)["perplexity"])
