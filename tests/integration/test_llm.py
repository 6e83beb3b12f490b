"""Three real node processes fine-tune a tiny llama-like model with LoRA on Shakespeare split
by speaking role: only adapters travel, every ledger agrees, the loss falls, and the
exported adapter loads with peft on the exported base and generates text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuflex.node.core.ledger import Ledger, verify_chain
from gpuflex.nodeconfig import dump_node_config
from tests.needs import needs
from tests.unit.ml.conftest import PLAY, shared_data_dir

pytestmark = [needs("peft"), pytest.mark.integration, pytest.mark.timeout(300)]


def shakespeare_file(tmp_path: Path) -> Path:
    """The real play text when the shared data is here, else a small built-in sample."""
    real = shared_data_dir() / "tinyshakespeare.txt"
    if real.is_file():
        return real
    path = tmp_path / "play.txt"
    path.write_text("\n".join([PLAY] * 40), encoding="utf-8")
    return path


def tiny_lora_spec(name: str = "lora-test", rounds: int = 3, local_steps: int = 6,
                   eval_sequences: int = 32) -> dict:  # type: ignore[type-arg]
    """Three nodes fine-tune a tiny llama with LoRA on Shakespeare split by speaking role."""
    return {
        "name": name, "model": "llama", "data": "shakespeare", "partition": "groups", "rounds": rounds,
        "local_epochs": 0, "local_steps": local_steps, "batch_size": 8, "optimizer": "adamw", "lr": 1e-2,
        "strategy": "diloco", "server_lr": 0.8, "codec": "int8", "min_nodes": 3, "test_fraction": 0.1,
        # Each node imports transformers when the job arrives; on a busy machine that takes
        # longer than the default plan timeout, and a backup would plan beside the coordinator.
        "plan_timeout_s": 20.0,
        "llm": {"size": "tiny", "adapter": "lora", "lora_rank": 4, "seq_len": 64, "eval_sequences": eval_sequences},
    }


def test_three_nodes_fine_tune_a_tiny_llama_with_lora_and_export_the_adapter(mesh_factory, tmp_path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text = shakespeare_file(tmp_path)
    mesh = mesh_factory(3)
    for i in range(3):  # each operator points its node at its own copy of the text
        mesh.home(i).mkdir(parents=True, exist_ok=True)
        (mesh.home(i) / "node.toml").write_text(dump_node_config({"data": {"shakespeare": str(text)}}))
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    job = mesh.submit(tiny_lora_spec())
    mesh.wait_job(job, [0, 1, 2], timeout=200)

    frames = []
    for i in range(3):
        ledger = Ledger(mesh.home(i) / "jobs" / job / "ledger.msgpack", job)
        assert ledger.load() == []
        verify_chain(ledger.frames, job)
        frames.append(ledger.frames)
    assert frames[0] == frames[1] == frames[2]
    rows = mesh.call(0, "ledger", {"job": job})
    assert len(rows) == 3 and all(r["metrics"]["contributors"] == 3 for r in rows)
    assert rows[-1]["metrics"]["loss"] < rows[0]["metrics"]["loss"]
    assert {mesh.job(i, job)["model_hash"] for i in range(3)} == {rows[-1]["model_hash"]}

    out = tmp_path / "results"
    mesh.call(2, "job_results", {"job": job, "out": str(out)}, timeout=120)
    meta = json.loads((out / "export.json").read_text())
    spec = json.loads((out / "job.json").read_text())["spec"]
    # The submitting node pinned the base and the tokenizer; every member checked them.
    assert spec["llm"]["base_hash"] == meta["base_hash"] and len(meta["base_hash"]) == 64
    assert spec["llm"]["tokenizer_hash"] == meta["tokenizer_hash"]
    # Only the adapter travels: the committed model blob (adapter + DiLoCo momentum) is a
    # small fraction of the base weights, which never left any node.
    base_bytes = (out / "base" / "model.safetensors").stat().st_size
    blob = (out / "model.blob").stat().st_size
    assert blob <= 2 * 4 * meta["trainable_parameters"] + 1024 < base_bytes / 5

    tok = AutoTokenizer.from_pretrained(out / "adapter")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out / "base"), out / "adapter")
    ids = tok("ROMEO:\n", return_tensors="pt").input_ids
    with torch.no_grad():
        gen = model.generate(input_ids=ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] == ids.shape[1] + 5
    assert isinstance(tok.decode(gen[0]), str)
