"""Text for language models: where it comes from, and how it becomes fixed-length sequences.

Two sources:

- ``shakespeare``: the play text split by speaking role (LEAF's natural non-IID split). Its
  path is the node's own: node.toml ``[data] shakespeare`` (or ``--data shakespeare=PATH``).
- ``text``: the node's private corpus, node.toml ``[text] <corpus>`` (or a ``[data]`` entry of
  that name), under ``partition = "local"``: text files, JSON Lines or Parquet files, or a
  Hugging Face ``datasets`` folder (see ``gpuflex.ml.llm.corpus``). The files never leave the
  machine; the job only names the corpus.

Each document (a role, a file) is tokenised, ended with the end-of-text token, and cut into
non-overlapping windows of ``seq_len + 1`` tokens, so inputs and next-token targets come from
one row and no padding is ever trained on. Rows keep their document as a group id for
``partition = "groups"``; the held-out rows are a seeded draw, the same on every node.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gpuflex.ml.datasets import split_indices, split_roles
from gpuflex.ml.llm import LLMError
from gpuflex.ml.llm.corpus import corpus_documents, read_document
from gpuflex.ml.llm.tokenizer import eos_id
from gpuflex.nodeconfig import NodeConfig

if TYPE_CHECKING:
    from gpuflex.jobspec import JobSpec

_cache: dict[tuple[Any, ...], TextBundle] = {}
_cache_lock = threading.Lock()


@dataclass
class TextBundle:
    """Packed rows of ``seq_len + 1`` token ids, split into train and held-out rows."""

    train: torch.Tensor  # int64 [n_train, seq_len + 1]
    test: torch.Tensor
    groups: np.ndarray  # per training row: the document (role, file) it came from
    group_names: list[str]

    @property
    def train_labels(self) -> np.ndarray:
        """Partitioning needs one label per row; a text row has no class, so all are 0."""
        return np.zeros(len(self.train), dtype=np.int64)


def shakespeare_path(spec: JobSpec, config: NodeConfig) -> Path:
    """The node's own copy: a job names the data set, never where it lives."""
    path = config.data_path("shakespeare")
    if path is None:
        raise LLMError("no Shakespeare text on this node: set [data] shakespeare = \"/path/tinyshakespeare.txt\" "
                       "in node.toml")
    return path


def documents(spec: JobSpec, config: NodeConfig) -> dict[str, str]:
    """Name -> text of each document of the job's data on this node."""
    if spec.data == "shakespeare":
        path = shakespeare_path(spec, config)
        roles = split_roles(read_document(path))
        if not roles:
            raise LLMError(f"{path} holds no role turns ('Name:' lines opening each speaker's turn)")
        return roles
    corpus = spec.llm["corpus"]
    try:
        files = config.text_files(corpus)
    except ValueError as exc:
        raise LLMError(str(exc)) from None
    return corpus_documents(files)


def pack(ids: np.ndarray, seq_len: int) -> np.ndarray:
    """Non-overlapping rows of ``seq_len + 1`` tokens (the last token of one row starts the
    next); a tail shorter than one row is dropped."""
    rows = (len(ids) - 1) // seq_len
    if rows <= 0:
        return np.zeros((0, seq_len + 1), dtype=np.int64)
    starts = np.arange(rows) * seq_len
    return ids[starts[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int64)


def build_bundle(spec: JobSpec, docs: dict[str, str], tokenizer: Any) -> TextBundle:
    seq_len = spec.llm["seq_len"]
    names = sorted(docs)
    encoded = tokenizer.encode_batch([docs[n] for n in names], add_special_tokens=False)
    end = eos_id(tokenizer)
    rows, groups = [], []
    for gid, enc in enumerate(encoded):
        packed = pack(np.asarray([*enc.ids, end], dtype=np.int64), seq_len)
        if len(packed):
            rows.append(packed)
            groups.append(np.full(len(packed), gid, dtype=np.int64))
    if not rows:
        raise LLMError(f"the text holds no document of at least {seq_len + 1} tokens; lower llm.seq_len")
    data, group = np.concatenate(rows), np.concatenate(groups)
    if len(data) < 2:
        raise LLMError(f"the text gives only {len(data)} sequence(s) of {seq_len + 1} tokens; "
                       "need at least 2 (lower llm.seq_len)")
    train, test = split_indices(group, spec.test_fraction, spec.seed, stratify=False)
    return TextBundle(torch.from_numpy(data[train]), torch.from_numpy(data[test]), group[train], names)


def load_text(spec: JobSpec, config: NodeConfig, tokenizer: Any, tokenizer_digest: str) -> TextBundle:
    """The job's packed text on this node, cached per process (in-process meshes share it)."""
    source = (str(shakespeare_path(spec, config)) if spec.data == "shakespeare"
              else tuple(str(p) for p in config.corpus_paths(spec.llm["corpus"])))
    key = (spec.data, source, tokenizer_digest, spec.llm["seq_len"], spec.seed, spec.test_fraction)
    with _cache_lock:
        if key not in _cache:
            _cache[key] = build_bundle(spec, documents(spec, config), tokenizer)
        return _cache[key]
