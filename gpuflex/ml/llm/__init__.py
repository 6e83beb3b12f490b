"""Causal language models on the mesh: transformers models, LoRA adapters through peft,
locally trained tokenizers, packed text, and exports the Hugging Face ecosystem loads.

The node never learns that a job is a language model: :class:`LLMWorkload` offers the same
flat-vector interface as every other workload, and its vector holds only the trainable
tensors (the LoRA adapters, or every weight for a full fine-tune). The base weights stay on
each node and are checked by content hash before the first round.

``transformers``, ``peft``, ``safetensors`` and ``tokenizers`` come with the ``gpuflex[llm]``
extra and are imported only when a language-model job needs them, so query commands stay fast.
"""

from __future__ import annotations

import importlib
import os

from gpuflex.errors import GpuflexError

EXTRA_MODULES = ("transformers", "peft", "safetensors", "tokenizers")


class LLMError(GpuflexError, RuntimeError):
    """A language-model job cannot run here; the message is one line that says why."""


def require_extra() -> None:
    """Fail in one clear line on a node without the ``llm`` extra; never reach for a hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    missing = []
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise LLMError(f"this node cannot run language-model jobs: {', '.join(missing)} not installed "
                       "(pip install 'gpuflex[llm]')")
