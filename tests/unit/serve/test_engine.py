"""Continuous batching gives each sequence exactly what plain ``generate`` gives it alone
(greedy), however requests arrive, join and leave the batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import trio

from gpuflex.ml.llm.tokenizer import EOS, byte_tokenizer
from gpuflex.serve import BadRequest, Overloaded
from gpuflex.serve.request import GenRequest
from gpuflex.serve.scheduler import Scheduler
from tests.needs import needs

pytestmark = needs("transformers")  # imported by the tests that run, not at collection in every worker

PROMPTS = ["ROMEO:\n", "Hi", "To be or not to be", "x" * 40, "abc", "é∂ unicode"]


def tiny(family: str) -> Any:
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    if family == "llama":
        cfg = LlamaConfig(vocab_size=257, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                          tie_word_embeddings=False, eos_token_id=256, bos_token_id=256)
    else:
        cfg = GPT2Config(vocab_size=257, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                         eos_token_id=256, bos_token_id=256)
    return AutoModelForCausalLM.from_config(cfg).eval()


def tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(), eos_token=EOS)


def reference(model: Any, tok: Any, prompt: str, n: int) -> str:
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(input_ids=ids, max_new_tokens=n, do_sample=False, pad_token_id=256)
    return str(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


def scheduler(model: Any, tok: Any, **kw: Any) -> Scheduler:
    args = {"max_batch": 3, "memory_bytes": 1 << 24, "max_prompt_tokens": 64, "max_new_tokens": 32, "queue": 8}
    return Scheduler("t", model, tok, 256, **{**args, **kw})


async def collect(s: Scheduler, req: GenRequest, delay: float = 0.0) -> tuple[str, dict[str, Any]]:
    await trio.sleep(delay)
    text, last = "", {}
    async for item in s.generate(req):
        text += item.get("text", "")
        last = item
    return text, last


@pytest.mark.parametrize("family", ["llama", "gpt2"])
async def test_staggered_requests_in_a_continuous_batch_match_generate_alone(family: str) -> None:
    model, tok = tiny(family), tokenizer()
    expected = [reference(model, tok, p, 12) for p in PROMPTS]
    s = scheduler(model, tok)
    got: dict[int, str] = {}
    async with trio.open_nursery() as outer:
        outer.start_soon(s.run)

        async def one(i: int) -> None:
            got[i], last = await collect(s, GenRequest("t", PROMPTS[i], 12, 0.0), delay=0.003 * i)
            assert last["usage"]["completion_tokens"] <= 12

        async with trio.open_nursery() as inner:
            for i in range(len(PROMPTS)):
                inner.start_soon(one, i)
        outer.cancel_scope.cancel()
    assert [got[i] for i in range(len(PROMPTS))] == expected
    assert s.engine.size == 0 and s.engine.cache is None  # every finished sequence left the batch


async def test_stop_strings_end_the_text_before_them_and_a_seed_repeats_a_sample() -> None:
    model, tok = tiny("llama"), tokenizer()
    full = reference(model, tok, "abc", 20)
    stop = full[5:7]
    s = scheduler(model, tok)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.run)
        text, last = await collect(s, GenRequest("t", "abc", 20, 0.0, stop=(stop,)))
        a, _ = await collect(s, GenRequest("t", "abc", 20, 0.9, seed=7))
        b, _ = await collect(s, GenRequest("t", "abc", 20, 0.9, seed=7))
        nursery.cancel_scope.cancel()
    assert text == full[:full.index(stop)] and last["finish"] == "stop"
    assert a == b


async def test_limits_refuse_what_cannot_fit_and_a_full_queue_says_so() -> None:
    model, tok = tiny("gpt2"), tokenizer()
    s = scheduler(model, tok, max_prompt_tokens=8, memory_bytes=512 * 20, queue=1)  # 512 bytes of cache a token
    with pytest.raises(BadRequest, match="at most 8"):
        await collect(s, GenRequest("t", "x" * 20, 4, 0.0))
    with pytest.raises(BadRequest, match="cache"):
        await collect(s, GenRequest("t", "x" * 4, 32, 0.0))
    s.waiting.append(object())  # type: ignore[arg-type]  # a full queue, without a running batch
    with pytest.raises(Overloaded):
        await collect(s, GenRequest("t", "x", 2, 0.0))


async def test_a_burst_arriving_together_is_held_to_the_queue_limit() -> None:
    """Requests past the queue check hold their place while their prompt is encoded (in a
    thread): five arriving together at a queue of 2 leave 2 queued and 3 refused, not 5 queued."""
    model, tok = tiny("gpt2"), tokenizer()
    s = scheduler(model, tok, queue=2)  # its batch loop is not running: nothing leaves the queue
    refused: list[str] = []

    async def one() -> None:
        try:
            async for _ in s.generate(GenRequest("t", "x", 2, 0.0)):
                pass
        except Overloaded as exc:
            refused.append(str(exc))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(one)
        with trio.fail_after(20):
            while len(refused) + len(s.waiting) < 5:
                await trio.sleep(0.01)
        assert len(s.waiting) == 2 and len(refused) == 3 and s.load == 2
        assert "2 requests waiting" in refused[0]
        nursery.cancel_scope.cancel()
