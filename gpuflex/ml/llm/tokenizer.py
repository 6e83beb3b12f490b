"""Tokenizers that every member of a job builds alike, and the hash that proves it.

Two kinds are built here, both as ``tokenizers`` objects so that one code path encodes,
hashes and exports them:

- ``bytes``: byte-level, one token per byte (ids 0-255 are the byte values) plus an
  end-of-text token. Nothing to train, identical everywhere, fine for any language.
- ``bpe``: byte-level BPE trained on the job's shared text (Shakespeare) with the job's
  vocabulary size. Training is deterministic, and the hash catches any node where it is not.

A third, ``model``, is the tokenizer that ships in a pretrained model's directory.

The hash is BLAKE3 over the tokenizer's canonical JSON. The submitting node records it in the
job, and every member compares its own before it trains: two members that tokenise
differently would average nonsense.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import blake3

EOS = "<|endoftext|>"
#: BPE is trained on at most this much text: enough for a few thousand merges, and cheap.
TRAIN_CHARS = 4_000_000
_cache: dict[tuple[Any, ...], Any] = {}
_cache_lock = threading.Lock()


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what ByteLevel uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer() -> Any:
    """One token per byte, ids equal to byte values, then ``<|endoftext|>`` as 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _byte_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int) -> Any:
    """Byte-level BPE of ``vocab_size`` tokens trained on ``texts`` (single-threaded order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet()))
    budget, chunks = TRAIN_CHARS, []
    for text in texts:
        chunks.append(text[:budget])
        budget -= len(chunks[-1])
        if budget <= 0:
            break
    tok.train_from_iterator(chunks, trainer)
    return tok


def load_model_tokenizer(model_dir: Path) -> Any:
    """The ``tokenizer.json`` shipped in a pretrained model's (operator-configured) directory."""
    from tokenizers import Tokenizer

    from gpuflex.ml.llm import LLMError

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise LLMError(f"{model_dir} has no tokenizer.json; use tokenizer = 'bytes' or 'bpe' for this job")
    return Tokenizer.from_file(str(path))


def tokenizer_hash(tok: Any) -> str:
    """BLAKE3 of the canonical JSON (keys sorted), so formatting never changes the hash."""
    canonical = json.dumps(json.loads(tok.to_str()), sort_keys=True, separators=(",", ":"))
    return str(blake3.blake3(canonical.encode("utf-8")).hexdigest())


def eos_id(tok: Any) -> int:
    token = tok.token_to_id(EOS)
    if token is None:  # a pretrained tokenizer with its own end-of-text token
        for name in ("</s>", "<eos>", "<|end_of_text|>"):
            token = tok.token_to_id(name)
            if token is not None:
                break
    return int(token) if token is not None else 0


def make_tokenizer(kind: str, vocab_size: int, texts: Iterable[str] | None = None,
                   model_dir: Path | None = None) -> Any:
    """The job's tokenizer; BPE is trained once per process per text and cached."""
    if kind == "bytes":
        return byte_tokenizer()
    if kind == "model":
        assert model_dir is not None
        return load_model_tokenizer(model_dir)
    text = list(texts or [])
    key = ("bpe", vocab_size, blake3.blake3("\x00".join(text).encode("utf-8", "replace")).hexdigest())
    with _cache_lock:
        if key not in _cache:
            _cache[key] = train_bpe(text, vocab_size)
        return _cache[key]


def save_hf_tokenizer(tok: Any, out: Path, max_length: int) -> None:
    """Write the tokenizer so that ``AutoTokenizer.from_pretrained(out)`` loads it."""
    from transformers import PreTrainedTokenizerFast

    eos = tok.id_to_token(eos_id(tok))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=eos, unk_token=eos,
                                   model_max_length=max_length)
    fast.save_pretrained(str(out))
