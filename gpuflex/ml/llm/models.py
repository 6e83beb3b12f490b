"""Causal language models: built from a config, or loaded from an operator's directory.

``llama`` and ``gpt2`` are built from a named size (see gpuflex/llmspec.py) with the job's
explicit config on top, under the job's seed, so every node builds the same weights without
any of them travelling. ``pretrained`` loads ``[models] <name>`` from the node's node.toml:
the job names the model, the node's operator says where it is. Nothing is downloaded.

:func:`base_hash` is the content hash of the base weights that every member checks before
it trains: two nodes on different bases (another torch, another checkpoint) would average
adapters that mean different things.
"""

from __future__ import annotations

import warnings
from typing import Any

import blake3
import torch
from torch import nn

from gpuflex.llmspec import model_config
from gpuflex.ml.llm import LLMError
from gpuflex.ml.models import seeded_build
from gpuflex.nodeconfig import NodeConfig, NodeConfigError


def hf_config(family: str, settings: dict[str, Any], vocab_size: int, eos: int) -> Any:
    """A transformers config for the job's size; dropout off, so a round is a pure function
    of the data order (LoRA has its own dropout setting)."""
    c = model_config(settings)
    if family == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(vocab_size=vocab_size, n_embd=c["hidden_size"], n_layer=c["num_hidden_layers"],
                          n_head=c["num_attention_heads"], n_inner=c["intermediate_size"],
                          n_positions=c["max_position_embeddings"], resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, bos_token_id=eos, eos_token_id=eos)
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"],
                       num_attention_heads=c["num_attention_heads"],
                       num_key_value_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                       intermediate_size=c["intermediate_size"], max_position_embeddings=c["max_position_embeddings"],
                       tie_word_embeddings=False, bos_token_id=eos, eos_token_id=eos, pad_token_id=None)


def load_pretrained(directory: Any) -> nn.Module:
    """A causal LM from a local directory, safetensors only (no pickle), never the hub."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True, use_safetensors=True,
                                                     trust_remote_code=False)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LLMError(f"cannot load the pretrained model in {directory}: {first}") from None
    return model.float()


def build_base(spec: Any, config: NodeConfig, vocab_size: int, eos: int) -> nn.Module:
    """The job's base model on the CPU in float32, identical on every node that holds the
    same inputs."""
    if spec.model == "pretrained":
        try:
            directory = config.model_dir(spec.llm["pretrained"])
        except NodeConfigError as exc:
            raise LLMError(str(exc)) from None
        model: Any = load_pretrained(directory)
        have = model.get_input_embeddings().weight.shape[0]
        if vocab_size > have:
            raise LLMError(f"the tokenizer has {vocab_size} tokens, the pretrained model's embedding only {have}")
    else:
        from transformers import AutoModelForCausalLM

        cfg = hf_config(spec.model, spec.llm, vocab_size, eos)
        with seeded_build(spec.seed):
            model = AutoModelForCausalLM.from_config(cfg)
        model = model.float()
    model.config.use_cache = False
    return model


def base_hash(model: nn.Module) -> str:
    """BLAKE3 over every tensor of the state dict (name, dtype, shape, bytes), in name
    order; streamed tensor by tensor, so it needs no copy of the model."""
    hasher = blake3.blake3()  # the mesh's blob hash, without importing the mesh
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        hasher.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        hasher.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return str(hasher.hexdigest())


def with_adapter(model: nn.Module, spec: Any) -> nn.Module:
    """Wrap ``model`` in a LoRA adapter (only the adapter trains), or train every weight.

    The adapter's initial weights come from the job's seed, like a built model's.
    """
    settings = spec.llm
    if settings["adapter"] == "none":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in settings["lora_targets"] if t not in present]
    if missing:
        raise LLMError(f"lora_targets {missing} name no module of this model "
                       f"(it has, e.g., {', '.join(sorted(n for n in present if 'proj' in n or 'attn' in n)[:8])})")
    lora = LoraConfig(r=settings["lora_rank"], lora_alpha=settings["lora_alpha"],
                      lora_dropout=settings["lora_dropout"], target_modules=list(settings["lora_targets"]),
                      bias="none", task_type="CAUSAL_LM", fan_in_fan_out=spec.model == "gpt2")
    with seeded_build(spec.seed + 1), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft reads a renamed transformers attribute
        return get_peft_model(model, lora)


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The tensors a round trains and the mesh moves, in a fixed order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]
