"""Serving: batching throughput, and the time to first token that routing through another node adds.

``python -m benchmarks.serving [--quick] [--json]``

1. **Batching.** One llama-like model (the ``small`` size's shape, byte tokenizer, random
   weights: throughput does not depend on what the weights say), on this process's CPU
   threads. The same requests (prompt, ``max_tokens`` new tokens each, greedy, no early stop)
   are answered (a) one at a time by plain transformers ``generate`` with its KV cache and
   (b) by the node's scheduler (``gpuflex.serve.scheduler``) with 8 concurrent clients, each
   sending its requests one after another, and (c) by the same scheduler one request at a
   time, which separates what batching gains from what generate's own per-step cost loses.
   All three run here, side by side, on the same threads.
2. **Routing overhead.** Two real nodes on loopback serve nothing but one tiny model on
   node A. The time to the first streamed token of ``/v1/completions`` is measured through
   A's own API (direct, local) and through B's API (B routes it to A over the mesh), in
   alternation, and the medians are compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_json_flag, emit, format_table, log


def build_model(hidden: int, layers: int, positions: int) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    from gpuflex.ml.llm.tokenizer import EOS, byte_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=257, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), intermediate_size=hidden * 4,
                      max_position_embeddings=positions, tie_word_embeddings=False,
                      eos_token_id=256, bos_token_id=256)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    return model, PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(), eos_token=EOS)


def batching_model_dir(tmp: Path, hidden: int, layers: int) -> tuple[Path, tuple[Any, Any]]:
    """The batching model saved as a Hugging Face directory (for another stack to convert)."""
    model, tok = build_model(hidden, layers, 512)
    model.save_pretrained(tmp / "m")
    tok.save_pretrained(tmp / "m")
    return tmp / "m", (model, tok)


def scheduler_run(model: Any, tok: Any, prompts: list[str], new_tokens: int, clients: int) -> tuple[float, int]:
    """(seconds, tokens made) for ``prompts`` on the node's scheduler, ``clients`` at once, each
    sending its share one after another; greedy, exactly ``new_tokens`` each."""
    import trio

    from gpuflex.serve.request import GenRequest
    from gpuflex.serve.scheduler import Scheduler

    model.generation_config.eos_token_id = None  # every request makes exactly new_tokens tokens
    sched = Scheduler("bench", model, tok, None, max_batch=clients, memory_bytes=1 << 30,
                      max_prompt_tokens=256, max_new_tokens=new_tokens, queue=len(prompts))
    made = 0

    async def client(mine: list[str]) -> None:
        nonlocal made
        for p in mine:
            async for item in sched.generate(GenRequest("bench", p, new_tokens, 0.0)):
                made += 1 if "n" in item else 0

    async def main() -> float:
        async with trio.open_nursery() as outer:
            outer.start_soon(sched.run)
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for c in range(clients):
                    nursery.start_soon(client, prompts[c::clients])
            elapsed = time.perf_counter() - t0
            outer.cancel_scope.cancel()
        return elapsed

    return trio.run(main), made


def batching(requests: int, clients: int, new_tokens: int, hidden: int, layers: int) -> dict[str, Any]:
    import torch

    model, tok = build_model(hidden, layers, 512)
    prompts = [f"Request {i}: tell the story of the {i}th king.\n" for i in range(requests)]
    model.generation_config.eos_token_id = None  # every request makes exactly new_tokens tokens
    start = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            model.generate(input_ids=ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=0)
    plain_s = time.perf_counter() - start
    single_s, _ = scheduler_run(model, tok, prompts, new_tokens, 1)  # the same engine, one request at a time
    batched_s, made = scheduler_run(model, tok, prompts, new_tokens, clients)
    total = requests * new_tokens
    return {"requests": requests, "clients": clients, "new_tokens": new_tokens, "hidden": hidden, "layers": layers,
            "torch_threads": torch.get_num_threads(), "tokens_made_batched": made,
            "plain_generate_s": round(plain_s, 2), "plain_tok_s": round(total / plain_s, 1),
            "single_s": round(single_s, 2), "single_tok_s": round(total / single_s, 1),
            "batched_s": round(batched_s, 2), "batched_tok_s": round(total / batched_s, 1),
            "speedup": round(plain_s / batched_s, 2), "batching_gain": round(single_s / batched_s, 2)}


def ttft(url: str, model: str, prompt: str) -> float:
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"text": ""' not in line and line != "data: [DONE]":
                return time.perf_counter() - t0
    raise RuntimeError("no token came back")


def tiny_serving_mesh(tmp: Path, size: int, server: int, **kwargs: Any) -> Any:
    """A LocalMesh (not started) of ``size`` nodes, each with its API on a free loopback port,
    node ``server`` serving a tiny model as ``tiny``."""
    from gpuflex.localmesh import LocalMesh

    model, tok = build_model(64, 2, 256)
    model.save_pretrained(tmp / "m")
    tok.save_pretrained(tmp / "m")
    mesh = LocalMesh(tmp / "mesh", size, **kwargs)
    for i in range(size):
        mesh.home(i).mkdir(parents=True, exist_ok=True)
        models = f'[serve.models]\ntiny = "{tmp / "m"}"\n' if i == server else ""
        (mesh.home(i) / "node.toml").write_text(f'[serve]\nhttp = "127.0.0.1:0"\n{models}')
    return mesh


def routing(samples: int) -> dict[str, Any]:
    import httpx

    with tempfile.TemporaryDirectory(prefix="gpuflex-serve-bench-") as tmp:
        mesh = tiny_serving_mesh(Path(tmp), 2, server=0)
        try:
            mesh.start(timeout=120)
            mesh.wait_connected(60)
            urls = [mesh.call(i, "status")["serve"]["http"] for i in range(2)]

            def routed() -> bool:
                rows = httpx.get(f"{urls[1]}/v1/models", timeout=10).json()["data"]
                return any(r["id"] == "tiny" for r in rows)

            mesh.wait_until(routed, timeout=60)
            for url in urls:  # warm both paths
                ttft(url, "tiny", "warm up")
            direct, via = [], []
            for k in range(samples):
                direct.append(ttft(urls[0], "tiny", f"sample {k}"))
                via.append(ttft(urls[1], "tiny", f"sample {k}"))
        finally:
            mesh.close()
    d, v = statistics.median(direct) * 1000, statistics.median(via) * 1000
    return {"samples": samples, "direct_ttft_ms_p50": round(d, 1), "routed_ttft_ms_p50": round(v, 1),
            "overhead_ms_p50": round(v - d, 1)}


def render(result: dict[str, Any]) -> str:
    b, r = result["batching"], result["routing"]
    return "\n".join([
        format_table([b], [("requests", "requests", "d"), ("clients", "clients", "d"),
                           ("new_tokens", "new tokens", "d"), ("torch_threads", "threads", "d"),
                           ("plain_tok_s", "generate 1-at-a-time tok/s", ".1f"),
                           ("single_tok_s", "scheduler 1-at-a-time tok/s", ".1f"),
                           ("batched_tok_s", "scheduler 8 clients tok/s", ".1f"),
                           ("speedup", "vs generate", ".2f"), ("batching_gain", "vs 1-at-a-time", ".2f")]),
        format_table([r], [("samples", "samples", "d"), ("direct_ttft_ms_p50", "direct TTFT ms", ".1f"),
                           ("routed_ttft_ms_p50", "routed TTFT ms", ".1f"), ("overhead_ms_p50", "overhead ms", ".1f")]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--only", choices=["batching", "routing"], default=None)
    add_json_flag(parser)
    args = parser.parse_args()
    requests, samples = (8, 5) if args.quick else (args.requests, args.samples)
    result: dict[str, Any] = {"batching": {}, "routing": {}}
    if args.only != "routing":
        log("batching: plain generate one at a time, then 8 concurrent clients on the scheduler")
        result["batching"] = batching(requests, 8, args.new_tokens, 256, 4)
    if args.only != "batching":
        log("routing: time to first token direct and through another node")
        result["routing"] = routing(samples)
    emit(result, args.json, render)
    if args.json:
        return
    print(json.dumps(result))


if __name__ == "__main__":
    main()
