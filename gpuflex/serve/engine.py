"""Continuous batching over one causal language model, with a KV cache (torch, no trio).

The batch is a set of sequences decoded together, one token each per step, sharing one
key/value cache laid out ``[batch, heads, positions, head_dim]`` and left-padded: a row's
padding is masked out and its position ids count only its own tokens, so a sequence's
tokens do not depend on what else is in the batch (greedy decoding gives exactly what it
gives alone, up to float rounding).

Between two decode steps :meth:`BatchEngine.admit` prefills new sequences in one forward
pass and splices their cache into the running batch (padding the shorter side on the left),
and :meth:`BatchEngine.retire` drops finished ones (and the padding columns no row needs any
more). So a new request waits for one decode step, not for the batch to finish.

Every tensor the engine makes lives on the model's device (``gpuflex.serve.fit`` puts the
model there); the last position's logits come back to the CPU as float32, so sampling draws
from each sequence's CPU generator and a seed gives the same sample on any device.

Every method runs on one worker thread at a time (``scheduler.Scheduler`` calls them).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class Seq:
    """One sequence in (or waiting for) the batch."""

    rid: int
    prompt_ids: list[int]
    max_new: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: bool = False
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.temperature > 0:
            self.generator = torch.Generator()
            self.generator.manual_seed(self.seed if self.seed is not None else torch.seed() % (2**63))


def kv_bytes_per_token(config: Any, element_size: int = 4) -> int:
    """Cache bytes one token of one sequence holds (keys and values, every layer), at
    ``element_size`` bytes a number: 4 for float32, 2 for the fp16/bf16 a GPU serves in."""
    def first(*names: str) -> int:
        return int(next((v for v in (getattr(config, n, None) for n in names) if v), 1))

    heads = first("num_attention_heads", "n_head")
    kv_heads = first("num_key_value_heads", "num_attention_heads", "n_head")
    head_dim = first("head_dim") if getattr(config, "head_dim", None) else first("hidden_size", "n_embd") // heads
    return 2 * first("num_hidden_layers", "n_layer") * kv_heads * head_dim * element_size


def max_positions(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 1024)


def _pad_left(t: torch.Tensor, length: int) -> torch.Tensor:
    return t if t.shape[-2] == length else F.pad(t, (0, 0, length - t.shape[-2], 0))


def model_device(model: Any) -> torch.device:
    """Where ``model``'s weights are (the CPU for a model without parameters)."""
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


#: Changes the last position's logits before a token is picked (``gpuflex.adversary``: a test
#: mesh's lying server); None on every honest node.
Tamper = Callable[[torch.Tensor], torch.Tensor]


class BatchEngine:
    def __init__(self, model: Any, eos_id: int | None, tamper: Tamper | None = None) -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.eos_id = eos_id
        self.tamper = tamper
        self.device = model_device(model)
        first = next(iter(model.parameters()), None)
        #: Cache bytes a token of one sequence holds, at the dtype the weights are in.
        self.per_token = kv_bytes_per_token(model.config, first.element_size() if first is not None else 4)
        self._cache_cls = DynamicCache
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.seqs: list[Seq] = []
        self.cache: Any = None
        self._reset()

    def _reset(self) -> None:
        """An empty batch (and no cache, so the device can hand its memory back)."""
        self.seqs, self.cache = [], None
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.last_pos = torch.zeros(0, dtype=torch.long, device=self.device)
        self.pending = torch.zeros(0, dtype=torch.long, device=self.device)  # newest tokens, not yet cached

    def _tensor(self, rows: Any) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    @property
    def size(self) -> int:
        return len(self.seqs)

    @property
    def width(self) -> int:
        """Cache positions per row (the longest row plus the others' left padding)."""
        return int(self.mask.shape[1])

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                             **{self._cache_kw: cache})
        logits = out.logits[:, -1, :].float().cpu()
        return self.tamper(logits) if self.tamper is not None else logits

    def _pick(self, logits: torch.Tensor, seqs: Sequence[Seq]) -> list[int]:
        """Each row's next token: greedy at temperature 0, else nucleus sampling from the
        sequence's own seeded generator (so a seed reproduces a completion)."""
        logp = torch.log_softmax(logits, dim=-1)
        chosen: list[int] = []
        for row, seq in enumerate(seqs):
            if seq.generator is None:
                token = int(torch.argmax(logits[row]))
            else:
                probs = torch.softmax(logits[row] / seq.temperature, dim=-1)
                if seq.top_p < 1.0:
                    sorted_p, order = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sorted_p, 0) - sorted_p < max(seq.top_p, 1e-9)
                    probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
                token = int(torch.multinomial(probs, 1, generator=seq.generator))
            seq.out_ids.append(token)
            if seq.logprobs:
                seq.out_logprobs.append(float(logp[row, token]))
            chosen.append(token)
        return chosen

    def admit(self, new: Sequence[Seq]) -> list[tuple[Seq, int]]:
        """Prefill ``new`` in one pass, sample each one's first token, and join the batch."""
        if not new:
            return []
        length = max(len(s.prompt_ids) for s in new)
        ids = self._tensor([[0] * (length - len(s.prompt_ids)) + s.prompt_ids for s in new])
        mask = self._tensor([[0] * (length - len(s.prompt_ids)) + [1] * len(s.prompt_ids) for s in new])
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self._cache_cls(config=self.model.config)
        logits = self._forward(ids, mask, pos, cache)
        firsts = self._pick(logits, new)
        self._join(cache, mask, pos[:, -1], self._tensor(firsts), list(new))
        return list(zip(new, firsts, strict=True))

    def _join(self, cache: Any, mask: torch.Tensor, last: torch.Tensor, pending: torch.Tensor,
              seqs: list[Seq]) -> None:
        if not self.seqs:
            self.cache, self.mask, self.last_pos, self.pending, self.seqs = cache, mask, last, pending, seqs
            return
        width = max(self.width, mask.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)])
            mine.values = torch.cat([_pad_left(mine.values, width), _pad_left(theirs.values, width)])
        self.mask = torch.cat([F.pad(self.mask, (width - self.width, 0)), F.pad(mask, (width - mask.shape[1], 0))])
        self.last_pos = torch.cat([self.last_pos, last])
        self.pending = torch.cat([self.pending, pending])
        self.seqs = self.seqs + seqs

    def step(self) -> list[tuple[Seq, int]]:
        """One decode step for every sequence in the batch: each gets one more token."""
        if not self.seqs:
            return []
        self.mask = torch.cat([self.mask, torch.ones(self.size, 1, dtype=self.mask.dtype, device=self.device)], dim=1)
        self.last_pos = self.last_pos + 1
        logits = self._forward(self.pending[:, None], self.mask, self.last_pos[:, None], self.cache)
        chosen = self._pick(logits, self.seqs)
        self.pending = self._tensor(chosen)
        return list(zip(self.seqs, chosen, strict=True))

    def retire(self, rids: set[int]) -> None:
        """Drop the sequences ``rids`` (finished or abandoned) from the batch."""
        keep = [i for i, s in enumerate(self.seqs) if s.rid not in rids]
        if len(keep) == len(self.seqs):
            return
        if not keep:
            self._reset()
            return
        index = self._tensor(keep)
        mask = self.mask[index]
        # Columns that are padding in every remaining row are no longer needed.
        used = mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, start:].contiguous()
            layer.values = layer.values[index, :, start:].contiguous()
        self.mask = mask[:, start:]
        self.last_pos, self.pending = self.last_pos[index], self.pending[index]
        self.seqs = [self.seqs[i] for i in keep]

    def widen(self, width: int) -> None:
        """Pad every row's cache on the left to ``width`` positions, masked out: the memory a
        batch holds when one of its rows reserves that many (the fitting probe's worst case)."""
        if not self.seqs or width <= self.width:
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = _pad_left(layer.keys, width), _pad_left(layer.values, width)
        self.mask = F.pad(self.mask, (width - self.width, 0))

    def probe(self, rows: int, prompt: int, width: int) -> None:
        """One real prefill of ``rows`` prompts of ``prompt`` tokens, the cache widened to
        ``width`` positions, and one decode step over it: what serving ``rows`` sequences at
        that reservation takes of the device. Raises what the model raises (out of memory,
        above all); leaves the batch empty either way. Only while nothing is being served."""
        if self.seqs:
            raise RuntimeError("the engine is serving; probe it before it takes requests")
        try:
            self.admit([Seq(-1 - i, [0] * max(1, prompt), 2, temperature=0.0) for i in range(rows)])
            self.widen(width - 1)
            self.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # an asynchronous failure surfaces here
        finally:
            self._reset()

    def cache_bytes(self) -> int:
        if self.cache is None:
            return 0
        return sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in self.cache.layers)
