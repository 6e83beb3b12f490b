"""The CUDA path of the language models, for a machine with a GPU.

Checks that the device is picked (CUDA first), that training runs under bfloat16 autocast with
float32 updates, and that evaluation, export and a reload through transformers and peft on the
GPU give the same logits; prints the 100M model's step time and peak GPU memory, LoRA and full.

    python -m benchmarks.llm_cuda            # tiny and base sizes (base wants a GPU)
    python -m benchmarks.llm_cuda --tiny     # tiny only: also a smoke test on a CPU
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.llm import SHAKESPEARE, write_home

RUNS = [("llama", "tiny", "lora"), ("gpt2", "tiny", "none"), ("llama", "base", "lora"), ("llama", "base", "none")]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reload_and_compare(work: Any, params: Any, out: Path) -> dict[str, Any]:
    """Export, load with transformers (and peft), and compare logits with the workload's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work.export_model(params, out)
    if work.settings["adapter"] == "none":
        model = AutoModelForCausalLM.from_pretrained(out / "model")
        tok = AutoTokenizer.from_pretrained(out / "model")
    else:
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out / "base"), out / "adapter")
        tok = AutoTokenizer.from_pretrained(out / "adapter")
    model = model.to(work.device).eval()
    ids = tok("ROMEO:\n", return_tensors="pt").input_ids.to(work.device)
    with torch.no_grad():
        ref = work.model.eval()(input_ids=ids).logits.float()
        got = model(input_ids=ids).logits.float()
        gen = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    return {"export_max_abs_diff": float((ref - got).abs().max()), "generated": tok.decode(gen[0])}


def main() -> None:
    from gpuflex.jobspec import JobSpec
    from gpuflex.ml.llm.pin import pin_llm_spec
    from gpuflex.ml.llm.workload import LLMWorkload

    cuda = torch.cuda.is_available()
    print("torch", torch.__version__, "device", torch.cuda.get_device_name(0) if cuda else "cpu (no CUDA)")
    home = write_home(Path(tempfile.mkdtemp(prefix="gpuflex-llm-cuda-")), SHAKESPEARE)
    results = {}
    for model, size, adapter in RUNS:
        if size != "tiny" and "--tiny" in sys.argv[1:]:
            continue
        spec = pin_llm_spec(JobSpec.from_dict({
            "model": model, "data": "shakespeare", "partition": "groups", "local_epochs": 0, "local_steps": 10,
            "batch_size": 8, "optimizer": "adamw", "lr": 1e-3 if adapter == "lora" else 1e-4,
            "llm": {"size": size, "adapter": adapter, "seq_len": 128, "eval_sequences": 64}}), home)
        work = LLMWorkload(spec, 0, 4, home)
        assert work.device.type == ("cuda" if cuda else "cpu"), work.device
        params = work.initial_params()
        before = work.evaluate(params)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        params += work.train(params)[0]  # a warm-up round
        start = time.perf_counter()
        delta, metrics = work.train(params)
        _sync()
        seconds = time.perf_counter() - start
        params += delta
        key = f"{model}-{size}-{adapter}"
        results[key] = {"trainable_params": work.num_params, "delta_dtype": str(delta.dtype),
                        "s_per_step": seconds / metrics["steps"], "tokens_per_s": metrics["tokens"] / seconds,
                        "loss_before": before["loss"], "loss_after": work.evaluate(params)["loss"],
                        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 1e6 if cuda else None}
        if size == "tiny":
            results[key].update(reload_and_compare(work, params, home / f"out-{key}"))
        print(key, json.dumps(results[key]), flush=True)
        del work
        if cuda:
            torch.cuda.empty_cache()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
