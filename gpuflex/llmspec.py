"""The ``[llm]`` table of a job file: language-model settings, validated and bounded.

A job travels from peer to peer, so every number in it is an allocation some other machine
will make: the model's width and depth, the LoRA rank, the sequence length. Each is checked
against a bound here, and the model's parameter count is estimated and capped, before any
node builds anything. The table is normalised (defaults filled in, names checked) so that one
job has one canonical form and every member hashes it alike. Pure Python: the CLI validates
job files and must start fast.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

#: Built-in causal LMs: ``llama`` and ``gpt2`` are built from a config, ``pretrained`` is
#: loaded from a directory that the node's operator names in node.toml ``[models]``.
LLM_MODELS: tuple[str, ...] = ("llama", "gpt2", "pretrained")
#: Text data: Shakespeare (split by speaking role) and ``text``, the node's own corpus.
TEXT_DATA: tuple[str, ...] = ("shakespeare", "text")
LLM_PARTITIONS: tuple[str, ...] = ("iid", "groups", "local")
ADAPTERS: tuple[str, ...] = ("none", "lora")
TOKENIZERS: tuple[str, ...] = ("bytes", "bpe", "model")

#: Named sizes. ``vocab_size`` comes from the tokenizer, never from here.
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 172,
             "max_position_embeddings": 512},
    "small": {"hidden_size": 320, "num_hidden_layers": 8, "num_attention_heads": 8, "intermediate_size": 864,
              "max_position_embeddings": 1024},
    "base": {"hidden_size": 768, "num_hidden_layers": 14, "num_attention_heads": 12, "intermediate_size": 2048,
             "max_position_embeddings": 1024},
}
#: Config keys a job may set, with inclusive bounds.
CONFIG_BOUNDS: dict[str, tuple[int, int]] = {
    "hidden_size": (8, 8192),
    "num_hidden_layers": (1, 96),
    "num_attention_heads": (1, 128),
    "num_key_value_heads": (1, 128),
    "intermediate_size": (8, 32768),
    "max_position_embeddings": (16, 32768),
}
#: The largest model a job may ask a node to build: 1e9 parameters, 4 GB in float32.
MAX_PARAMS = 1_000_000_000
DEFAULT_TARGETS: dict[str, list[str]] = {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn"],
                                          "pretrained": ["q_proj", "v_proj"]}
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")

DEFAULTS: dict[str, Any] = {
    "size": "small",
    "config": {},
    "pretrained": "",
    "adapter": "none",
    "lora_rank": 8,
    "lora_alpha": 16.0,
    "lora_dropout": 0.0,
    "lora_targets": None,  # per model family, see DEFAULT_TARGETS
    "tokenizer": "bytes",
    "vocab_size": 1024,
    "seq_len": 128,
    "corpus": "",
    "eval_sequences": 64,
    "grad_clip": 1.0,
    "base_hash": "",
    "tokenizer_hash": "",
}


def is_llm(model: object) -> bool:
    return model in LLM_MODELS


def _int_in(key: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def _float_in(key: str, value: Any, low: float, high: float, *, open_high: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and low <= value and (value < high if open_high else value <= high)
    if not ok:
        right = ")" if open_high else "]"
        raise ValueError(f"{key} must be a number in [{low:g}, {high:g}{right}, got {value!r}")
    return float(value)


def _choice(key: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{key} must be one of {', '.join(repr(o) for o in options)}, got {value!r}")
    return str(value)


def _config(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise ValueError(f"config must be a table of integers, got {value!r}")
    out = {}
    for key, v in value.items():
        if key not in CONFIG_BOUNDS:
            raise ValueError(f"config.{key} is not a setting a job may choose "
                             f"(allowed: {', '.join(CONFIG_BOUNDS)})")
        out[str(key)] = _int_in(f"config.{key}", v, *CONFIG_BOUNDS[key])
    return dict(sorted(out.items()))


def model_config(settings: Mapping[str, Any]) -> dict[str, int]:
    """The named size with the job's explicit config on top (for built-from-config models)."""
    return {**SIZES[settings["size"]], **settings["config"]}


def estimate_params(config: Mapping[str, int], vocab_size: int, family: str) -> int:
    """Parameters of a llama-like or GPT-2-like model of ``config``, to within a few percent."""
    h, layers, inter = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    if family == "gpt2":
        per_layer = 4 * h * h + 2 * h * inter + 9 * h + inter
        return layers * per_layer + vocab_size * h + config["max_position_embeddings"] * h
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    attn = 2 * h * h + 2 * h * (h // heads) * kv
    return layers * (attn + 3 * h * inter + 2 * h) + 2 * vocab_size * h


def spec_params(model: str, settings: Mapping[str, Any]) -> int | None:
    """The parameter count of the model a normalised ``[llm]`` table builds, from the spec's
    arithmetic alone (nothing is built); None for a pretrained model, which is the operator's
    own directory."""
    if model == "pretrained":
        return None
    vocab = settings["vocab_size"] if settings["tokenizer"] == "bpe" else 257
    return estimate_params(model_config(settings), vocab, model)


def normalize_llm(value: Any, model: str) -> dict[str, Any]:
    """Validate the ``[llm]`` table of a job whose model is ``model``; defaults filled in.

    Raises ValueError naming the first bad key.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a table, got {type(value).__name__}")
    unknown = sorted((str(k) for k in set(value) - set(DEFAULTS)), key=str)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (expected {', '.join(DEFAULTS)})")
    s: dict[str, Any] = {**DEFAULTS, **value}
    s["size"] = _choice("size", s["size"], tuple(SIZES))
    s["config"] = _config(s["config"])
    s["adapter"] = _choice("adapter", s["adapter"], ADAPTERS)
    s["lora_rank"] = _int_in("lora_rank", s["lora_rank"], 1, 256)
    s["lora_alpha"] = _float_in("lora_alpha", s["lora_alpha"], 1e-3, 4096.0)
    s["lora_dropout"] = _float_in("lora_dropout", s["lora_dropout"], 0.0, 1.0, open_high=True)
    targets = s["lora_targets"] if s["lora_targets"] is not None else DEFAULT_TARGETS[model]
    if (not isinstance(targets, list) or not 1 <= len(targets) <= 32
            or not all(isinstance(t, str) and _MODULE_RE.match(t) for t in targets)):
        raise ValueError(f"lora_targets must be a list of 1 to 32 module names like 'q_proj', got {targets!r}")
    s["lora_targets"] = sorted(set(targets))
    s["tokenizer"] = _choice("tokenizer", s["tokenizer"], TOKENIZERS)
    s["vocab_size"] = _int_in("vocab_size", s["vocab_size"], 260, 65536)
    s["seq_len"] = _int_in("seq_len", s["seq_len"], 8, 8192)
    s["eval_sequences"] = _int_in("eval_sequences", s["eval_sequences"], 1, 100_000)
    s["grad_clip"] = _float_in("grad_clip", s["grad_clip"], 0.0, 1e6)
    for key in ("pretrained", "corpus"):
        if s[key] != "" and not (isinstance(s[key], str) and _NAME_RE.match(s[key])):
            raise ValueError(f"{key} must be a name from the node's configuration (letters, digits, '_.-'), "
                             f"got {s[key]!r}")
    for key in ("base_hash", "tokenizer_hash"):
        if s[key] != "" and not (isinstance(s[key], str) and _HASH_RE.match(s[key])):
            raise ValueError(f"{key} must be empty or 64 lowercase hex digits, got {s[key]!r}")
    if model == "pretrained":
        if not s["pretrained"]:
            raise ValueError("pretrained must name a model of the node's node.toml [models] for model 'pretrained'")
        if s["config"]:
            raise ValueError("config cannot change a pretrained model")
    else:
        if s["pretrained"]:
            raise ValueError(f"pretrained is only for model 'pretrained', not {model!r}")
        if s["tokenizer"] == "model":
            raise ValueError("tokenizer 'model' reads a pretrained model's tokenizer; use 'bytes' or 'bpe'")
        config = model_config(s)
        if config["hidden_size"] % config["num_attention_heads"]:
            raise ValueError("config: hidden_size must be a multiple of num_attention_heads")
        kv = config.get("num_key_value_heads", config["num_attention_heads"])
        if config["num_attention_heads"] % kv:
            raise ValueError("config: num_attention_heads must be a multiple of num_key_value_heads")
        if config["max_position_embeddings"] < s["seq_len"]:
            raise ValueError(f"seq_len {s['seq_len']} exceeds max_position_embeddings "
                             f"{config['max_position_embeddings']}")
        params = spec_params(model, s)
        if params is not None and params > MAX_PARAMS:
            raise ValueError(f"the model would have about {params / 1e6:,.0f}M parameters, "
                             f"more than the {MAX_PARAMS / 1e6:,.0f}M a job may ask for")
    return dict(sorted(s.items()))


def llm_cross_checks(values: dict[str, Any], failed: set[str]) -> list[tuple[str, str]]:
    """Rules between the model, the data, the partition and ``[llm]``; normalises
    ``values["llm"]`` in place for language-model jobs."""
    model, data = values.get("model"), values.get("data")
    if "model" in failed:
        return []
    errors: list[tuple[str, str]] = []
    if not is_llm(model):
        if values.get("llm"):
            errors.append(("llm", f"is only for the language models ({', '.join(LLM_MODELS)}), not {model!r}"))
        if data == "text":
            errors.append(("data", "'text' is language-model data; use model 'llama', 'gpt2' or 'pretrained'"))
        return errors
    try:
        values["llm"] = normalize_llm(values.get("llm", {}), str(model))
    except ValueError as exc:
        return [("llm", str(exc))]
    settings = values["llm"]
    partition = values.get("partition", "iid")
    if "data" not in failed and data not in TEXT_DATA:
        errors.append(("data", f"a language model trains on text data ({', '.join(TEXT_DATA)}), got {data!r}"))
    if "partition" not in failed and partition not in LLM_PARTITIONS:
        errors.append(("partition", f"text is split {', '.join(repr(p) for p in LLM_PARTITIONS)}, got {partition!r}"))
    if data == "text":
        if partition != "local":
            errors.append(("partition", "data 'text' is each node's own corpus: it needs partition = 'local'"))
        if not settings["corpus"]:
            errors.append(("llm", "corpus must name the node's node.toml [text] entry for data 'text'"))
        if settings["tokenizer"] == "bpe":
            errors.append(("llm", "tokenizer 'bpe' is trained on shared text; with private corpora use 'bytes' "
                                  "or a pretrained model's tokenizer ('model')"))
    elif settings["corpus"]:
        errors.append(("llm", "corpus is only for data 'text'"))
    for field in ("train_fn", "partitioner"):
        if values.get(field):
            errors.append((field, "is not supported for language models (the node trains them itself)"))
    return errors
