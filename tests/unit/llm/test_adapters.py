"""Only adapter tensors are the job's parameters; the base is pinned by hash; DiLoCo with the
int8 codec on adapters rebuilds the root's exact adapter on every member."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpuflex.ml.llm import LLMError
from gpuflex.ml.llm.pin import pin_llm_spec
from gpuflex.ml.llm.tokenizer import byte_tokenizer, tokenizer_hash
from gpuflex.ml.llm.workload import LLMWorkload
from gpuflex.node.core.modelblob import pack_model, unpack_model
from gpuflex.node.core.outerstep import outer_step, replay_step
from gpuflex.node.core.pipeline import DeltaEncoder, decode_payload
from mesh.blob import blob_hash

from .conftest import make_home, tiny_spec


def test_only_adapter_tensors_are_trained_encoded_and_sent(home: Path) -> None:
    spec = pin_llm_spec(tiny_spec(), home)
    work = LLMWorkload(spec, 0, 2, home)
    names = work.trainable_names
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    base_total = sum(p.numel() for n, p in work.model.named_parameters() if "lora_" not in n)
    assert work.num_params == sum(p.numel() for n, p in work.model.named_parameters() if "lora_" in n)
    assert work.num_params < 0.05 * base_total

    frozen = {n: p.detach().clone() for n, p in work.model.named_parameters() if "lora_" not in n}
    init = work.initial_params()
    delta, metrics = work.train(init)
    assert delta.shape == init.shape == (work.num_params,) and metrics["steps"] == 3
    assert np.count_nonzero(delta) > 0
    # The base did not move, so there is nothing of it to send.
    assert all(torch.equal(p, frozen[n]) for n, p in work.model.named_parameters() if "lora_" not in n)
    payload = DeltaEncoder(spec).encode(delta, metrics["samples"])
    assert len(payload) < 1.5 * work.num_params + 1024  # int8 of the adapter, not the model
    assert decode_payload(spec, payload, delta.size).shape == delta.shape
    assert set(work.state_dict(init + delta)) == set(names)


def test_every_member_checks_the_base_hash_and_refuses_a_different_base(home: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    def saved_model(path: Path, seed: int) -> Path:
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(LlamaConfig(
            vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)).save_pretrained(path)
        return path

    ours = make_home(tmp_path / "a", models={"mini": str(saved_model(tmp_path / "m1", 1))})
    theirs = make_home(tmp_path / "b", models={"mini": str(saved_model(tmp_path / "m2", 2))})
    spec = pin_llm_spec(tiny_spec("pretrained", pretrained="mini", size="small"), ours)
    assert len(spec.llm["base_hash"]) == 64
    assert LLMWorkload(spec, 0, 2, ours).base_hash == spec.llm["base_hash"]
    with pytest.raises(LLMError, match="refusing to join: this node's base model hashes to"):
        LLMWorkload(spec, 1, 2, theirs)
    unpinned = dataclasses.replace(spec, llm={**spec.llm, "base_hash": ""})
    with pytest.raises(LLMError, match="carries no base model hash"):
        LLMWorkload(unpinned, 0, 2, ours)
    with pytest.raises(LLMError, match="no \\[models\\] entry 'mini'"):
        LLMWorkload(spec, 0, 2, home)
    # The pretrained directory's own tokenizer.json, hashed like any other tokenizer.
    byte_tokenizer().save(str(tmp_path / "m1" / "tokenizer.json"))
    own = pin_llm_spec(tiny_spec("pretrained", pretrained="mini", tokenizer="model"), ours)
    assert LLMWorkload(own, 0, 1, ours).tokenizer_hash == own.llm["tokenizer_hash"] == tokenizer_hash(byte_tokenizer())
    with pytest.raises(LLMError, match=r"has no tokenizer\.json"):
        pin_llm_spec(tiny_spec("pretrained", pretrained="mini", tokenizer="model"), theirs)


def test_diloco_int8_on_adapters_rebuilds_the_exact_committed_adapter_on_every_member(home: Path) -> None:
    spec = pin_llm_spec(tiny_spec(), home)
    nodes = [LLMWorkload(spec, i, 2, home) for i in range(2)]
    root_blob = member_blob = pack_model(nodes[0].initial_params(), {})
    assert blob_hash(member_blob) == blob_hash(pack_model(nodes[1].initial_params(), {}))
    for _ in range(2):
        params, _ = unpack_model(root_blob)
        deltas = [DeltaEncoder(spec).encode(w.train(params)[0]) for w in nodes]
        avg = np.mean([decode_payload(spec, d, params.size) for d in deltas], axis=0)
        new, state, step = outer_step(spec, *unpack_model(root_blob), avg)
        assert step is not None and len(step) < 0.3 * len(pack_model(new, state))
        root_blob = pack_model(new, state)
        member_blob = pack_model(*replay_step(spec, *unpack_model(member_blob), step))
        assert blob_hash(member_blob) == blob_hash(root_blob)
    committed, _ = unpack_model(member_blob)
    nodes[1].evaluate(committed)  # loads the adapter into the member's model
    root_state = nodes[0].state_dict(unpack_model(root_blob)[0])
    member_state = {n: p.detach().cpu() for n, p in nodes[1].model.named_parameters() if "lora_" in n}
    assert root_state.keys() == member_state.keys()
    assert all(torch.equal(root_state[n], member_state[n]) for n in root_state)


def test_a_node_without_the_llm_extra_refuses_in_one_line(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    with pytest.raises(LLMError) as info:
        LLMWorkload(tiny_spec(), 0, 1, home)
    message = str(info.value)
    assert "\n" not in message and "peft" in message and "gpuflex[llm]" in message
