"""Pinning a language-model job to its inputs when it is submitted.

The node that signs a job computes the content hashes of the base weights and of the
tokenizer from its own copies and writes them into the spec, so they are part of the signed
job (and of its id). Every member then compares its own before the first round and refuses
to join on a mismatch (see :func:`gpuflex.ml.llm.workload.check_pinned`). Hashes a submitter
already wrote are kept: the submitting node is checked against them like everyone else.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpuflex.jobspec import JobSpec
from gpuflex.llmspec import is_llm
from gpuflex.ml.llm import LLMError, require_extra
from gpuflex.ml.llm.models import base_hash, build_base
from gpuflex.ml.llm.tokenizer import eos_id, tokenizer_hash
from gpuflex.nodeconfig import NodeConfig, NodeConfigError, load_node_config


def pin_llm_spec(spec: JobSpec, home: Path | None, config: NodeConfig | None = None) -> JobSpec:
    """``spec`` with ``llm.base_hash`` and ``llm.tokenizer_hash`` filled in from this node."""
    if not is_llm(spec.model) or (spec.llm["base_hash"] and spec.llm["tokenizer_hash"]):
        return spec
    require_extra()
    from gpuflex.ml.llm.workload import job_tokenizer

    try:
        config = config or load_node_config(home)
    except NodeConfigError as exc:
        raise LLMError(str(exc)) from None
    tok = job_tokenizer(spec, config)
    settings = dict(spec.llm)
    settings["tokenizer_hash"] = settings["tokenizer_hash"] or tokenizer_hash(tok)
    if not settings["base_hash"]:
        model = build_base(spec, config, tok.get_vocab_size(), eos_id(tok))
        settings["base_hash"] = base_hash(model)
        del model
    return dataclasses.replace(spec, llm=settings)
