"""Serving what the mesh trained, as real node processes on loopback.

Three nodes fine-tune a tiny llama with LoRA; two serve the finished job's adapter on its
pinned base, and the third, which serves nothing, answers the ``openai`` client by routing
each request over the mesh, streaming. Killing a server under load loses no request that had
not started streaming. Bad input gets a clear error while the node keeps serving and training.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuflex.nodeconfig import dump_node_config
from tests.integration.conftest import HONEST_PACE, light_spec, scaled_wait
from tests.integration.test_llm import shakespeare_file, tiny_lora_spec
from tests.needs import needs

openai = pytest.importorskip("openai", reason="the openai client is in the dev extra")
httpx = pytest.importorskip("httpx")
pytestmark = [needs("peft"), pytest.mark.integration, pytest.mark.timeout(600)]

SERVE = ('\n[serve]\nhttp = "127.0.0.1:0"\nmax_batch = {batch}\nmax_prompt_tokens = 256\nmax_new_tokens = 200\n'
         'queue = 16\n')
#: The bad-input test's servers' queue (requests waiting beyond the batch; more are refused).
QUEUE = 4


def serving_mesh(mesh_factory: Any, size: int, toml: Any) -> Any:
    """A started, connected mesh whose node ``i`` runs with ``toml(i)`` as its node.toml."""
    mesh = mesh_factory(size)
    for i in range(size):
        mesh.home(i).mkdir(parents=True, exist_ok=True)
        (mesh.home(i) / "node.toml").write_text(toml(i))
    mesh.start(timeout=120)
    mesh.wait_connected(60)
    return mesh


def api_url(mesh: Any, i: int) -> str:
    url = mesh.call(i, "status")["serve"]["http"]
    assert url and url.startswith("http://127.0.0.1:")
    return url


def servers_of(url: str, model: str) -> int:
    rows = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return next((r["servers"] for r in rows if r["id"] == model), 0)


def train_job(mesh_factory: Any, tmp_path: Path, batch: int) -> tuple[Any, str]:
    text = shakespeare_file(tmp_path)
    mesh = serving_mesh(mesh_factory, 3, lambda i: dump_node_config({"data": {"shakespeare": str(text)}})
                        + SERVE.format(batch=batch))
    job = mesh.submit(tiny_lora_spec(name="serve-test", rounds=2, local_steps=4, eval_sequences=16))
    mesh.wait_job(job, [0, 1, 2], timeout=240)
    return mesh, job


def test_a_trained_adapter_is_served_on_two_nodes_and_streamed_through_a_third_with_the_openai_client(
        mesh_factory: Any, tmp_path: Path) -> None:
    mesh, job = train_job(mesh_factory, tmp_path, batch=2)
    committed = {r["model_hash"] for r in mesh.call(0, "ledger", {"job": job})}
    from tests.integration.test_cli import gpuflex

    row = mesh.call(0, "serve_add", {"name": "bard", "job": job}, timeout=180)  # what the CLI asks
    assert row["hash"] in committed  # a ledger hash (the round final_model picks), checked on the bytes
    served = gpuflex("serve", job, "--name", "bard", "--home", str(mesh.home(1)), "--json", timeout=180)
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["hash"] == row["hash"]
    url = api_url(mesh, 2)
    mesh.wait_until(lambda: servers_of(url, "bard") == 2, timeout=30)

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused-on-loopback", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == ["bard"]
    direct = openai.OpenAI(base_url=f"{api_url(mesh, 0)}/v1", api_key="x", max_retries=0, timeout=120)
    local = direct.completions.create(model="bard", prompt="ROMEO:\n", max_tokens=12, temperature=0)
    pieces = [c.choices[0].text for c in client.completions.create(
        model="bard", prompt="ROMEO:\n", max_tokens=12, temperature=0, stream=True)]
    assert len([p for p in pieces if p]) >= 2  # streamed as made, not in one piece
    assert "".join(pieces) == local.choices[0].text  # greedy: the same text whichever server made it
    chat = client.chat.completions.create(model="bard", messages=[{"role": "user", "content": "Speak."}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason in ("length", "stop")
    assert chat.usage is not None and chat.usage.completion_tokens <= 8

    # Under load, kill one server: every request that had not started streaming is answered.
    results: dict[int, dict[str, Any]] = {}
    started = threading.Event()

    def ask(k: int) -> None:
        got: list[str] = []
        try:
            for c in client.completions.create(model="bard", prompt=f"KING {k}:\n", max_tokens=120,
                                               temperature=0.8, seed=k, stream=True):
                got.append(c.choices[0].text)
                if c.choices[0].text:
                    started.set()
            results[k] = {"ok": True, "text": "".join(got)}
        except openai.APIError as exc:
            results[k] = {"ok": False, "text": "".join(got), "error": str(exc)}

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(10)]
    for t in threads:
        t.start()
    assert started.wait(120)
    mesh.kill(0)
    for t in threads:
        t.join(300)
    assert len(results) == 10
    for k, r in results.items():
        if not r["ok"]:  # only a request that was already streaming may fail, and it says why
            assert r["text"], f"request {k} was lost before it started: {r['error']}"
            assert "stopped after" in r["error"], r["error"]
    assert sum(r["ok"] for r in results.values()) >= 6
    status = mesh.call(1, "status")["serve"]["models"][0]
    assert status["name"] == "bard" and status["requests"] >= 1 and status["tokens"] > 0


def test_bad_requests_get_clear_errors_while_the_node_keeps_serving_and_training(
        mesh_factory: Any, tmp_path: Path) -> None:
    model_dir = tiny_model_dir(tmp_path)
    checks = "redundancy = 2\ncheck_fraction = 1.0\n"  # node 1 checks what it takes in
    mesh = serving_mesh(mesh_factory, 2, lambda i: SERVE.format(batch=4).replace("queue = 16", f"queue = {QUEUE}")
                        + (checks if i == 1 else "") + f'[serve.models]\ntiny = "{model_dir}"\n')
    # More rounds than the test lasts, paced: the job is still training when the floods end.
    job = mesh.submit(light_spec(rounds=500, min_nodes=2, **HONEST_PACE))
    url = api_url(mesh, 1)
    ids = [mesh.call(i, "status")["peer_id"] for i in range(2)]
    mesh.wait_until(lambda: servers_of(url, "tiny") == 2, timeout=60)
    wait = scaled_wait(mesh, 120)

    def rounds() -> list[dict[str, Any]]:
        return list(mesh.call(0, "ledger", {"job": job}))

    wait(lambda: len(rounds()) >= 1, "the first committed round")

    def post(body: Any, raw: bytes | None = None) -> httpx.Response:
        return httpx.post(f"{url}/v1/completions", content=raw if raw is not None else json.dumps(body),
                          headers={"content-type": "application/json"}, timeout=60)

    cases = {
        "malformed JSON": (post(None, b"{not json"), 400, "not valid JSON"),
        "unknown model": (post({"model": "nope", "prompt": "x"}), 404, "no node serves model 'nope'"),
        "huge max_tokens": (post({"model": "tiny", "prompt": "x", "max_tokens": 10**9}), 400, "max_tokens"),
        "oversized prompt": (post({"model": "tiny", "prompt": "x" * 1000, "max_tokens": 4}), 400,
                             "this server takes at most 256"),
        "oversized body": (post(None, b'{"prompt": "' + b"x" * (2 << 20) + b'"}'), 413, "over"),
        "not an object": (post([1, 2]), 400, "JSON object"),
    }
    for name, (resp, status, words) in cases.items():
        assert resp.status_code == status, (name, resp.text)
        assert words in resp.json()["error"]["message"], (name, resp.text)
    # A foreign Host on loopback is refused (no DNS rebinding).
    assert httpx.get(f"{url}/v1/models", headers={"host": "evil.example"}, timeout=10).status_code == 421

    # A flood: three times as many requests at once as every server of the model holds (its
    # batch, as it announces it, and its queue) get 429s with a clear error, the rest their
    # answers; each server takes at least its queue's worth. The flood's greedy answer runs to
    # max_tokens (no early end of text), so each request holds its place for that many decode
    # steps while the others arrive, whichever servers the router spreads them over.
    servers: list[dict[str, Any]] = []

    def both_serve_tiny() -> bool:
        servers[:] = [r for r in mesh.call(1, "status")["serve"]["servers"] if "tiny" in r["models"]]
        return sorted(r["peer"] for r in servers) == sorted(ids)
    mesh.wait_until(both_serve_tiny, timeout=30)
    held = sum(r["capacity"] + QUEUE for r in servers)
    body = {"model": "tiny", "prompt": "flood", "max_tokens": 100, "temperature": 0}
    assert post(body).json()["usage"]["completion_tokens"] == 100
    clients = [httpx.Client(timeout=120) for _ in range(3 * held)]
    together = threading.Barrier(len(clients))
    answers: list[httpx.Response] = []

    def flood(client: httpx.Client) -> None:
        together.wait(60)
        answers.append(client.post(f"{url}/v1/completions", json=body))

    threads = [threading.Thread(target=flood, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for c in clients:
        c.close()
    codes = [r.status_code for r in answers]
    assert len(codes) == 3 * held and set(codes) <= {200, 429}, codes
    assert codes.count(200) >= QUEUE * len(servers) and 429 in codes, codes
    for r in answers:
        if r.status_code == 429:  # busy, said in one line, with when to ask again
            message = r.json()["error"]["message"]
            assert "'tiny'" in message and "try again shortly" in message and "\n" not in message, message
            assert r.headers["retry-after"] == "1"
        else:
            assert r.json()["usage"]["completion_tokens"] == 100
    # The node serves on once the flood drains: node 1 checks every answer it took in on the
    # other server, so the answers' checks can hold both queues a little longer; it is asked as
    # a client asks after a 429, when Retry-After says, for a minute at most.
    deadline = time.monotonic() + 60
    while (ok := post({"model": "tiny", "prompt": "still there?", "max_tokens": 5, "temperature": 0})).status_code \
            == 429 and time.monotonic() < deadline:
        time.sleep(float(ok.headers["retry-after"]))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 5, ok.text
    # Training went on through all of it: rounds keep committing after the floods, with the
    # flooded node itself among the contributors, and the job is running on both nodes.
    after_floods = len(rounds())
    wait(lambda: len(rounds()) >= after_floods + 2, "two rounds committed after the floods")
    assert any(ids[1] in {c["peer"] for c in r["contributors"]} for r in rounds()[after_floods:])
    assert [mesh.job(i, job)["state"] for i in range(2)] == ["running", "running"]
    # Every answer node 1 took in was run again on the other server: two honest servers agree.
    checks = mesh.call(1, "status")["serve"]["redundancy"]
    assert checks["level"] == 2 and checks["checked"] >= 1 and checks["mismatches"] == {}, checks
    served = mesh.call(1, "status")["serve"]["served_tokens"]
    assert sum(served.values()) > 0
    # Each server's figures, as it announces them, reach the other node's status (the
    # dashboard's and the portal's Serving views read these rows).

    def servers_with_figures() -> bool:
        rows = mesh.call(1, "status")["serve"]["servers"]
        return {r["peer"] for r in rows} == set(ids) and sum(r["tokens_per_s"] or 0 for r in rows) > 0
    mesh.wait_until(servers_with_figures, timeout=30)
    rows = {r["peer"]: r for r in mesh.call(1, "status")["serve"]["servers"]}
    assert rows[ids[1]]["self"] and rows[ids[0]]["rtt_ms"] is not None and rows[ids[0]]["models"] == ["tiny"]
    # The portal's playground path: one prompt through the router, answered whole, bounded.
    answer = mesh.call(1, "serve_complete", {"model": "tiny", "prompt": "ROMEO:", "max_tokens": 6, "temperature": 0},
                       timeout=120)
    assert answer["server"] in ids and answer["usage"]["completion_tokens"] <= 6 and answer["total_ms"] > 0
    same = post({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 6, "temperature": 0}).json()
    assert answer["text"] == same["choices"][0]["text"]
    from gpuflex.client import ControlError

    with pytest.raises(ControlError, match="max_tokens"):
        mesh.call(1, "serve_complete", {"model": "tiny", "prompt": "x", "max_tokens": 100_000})


def tiny_model_dir(tmp_path: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from gpuflex.ml.llm.tokenizer import EOS, byte_tokenizer

    model_dir = tmp_path / "tiny-gpt2"
    # Fixed weights: greedy tokens are compared with transformers' own generate, and random
    # untrained weights can hold near-ties that a batched forward pass breaks the other way (a
    # run answered '' where generate made 12 tokens).
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=257, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                               bos_token_id=256, eos_token_id=256)).save_pretrained(model_dir)
    PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(), eos_token=EOS).save_pretrained(model_dir)
    return model_dir


def test_a_batch_inference_job_spreads_over_the_servers_resumes_after_a_kill_and_matches_one_node(
        mesh_factory: Any, tmp_path: Path) -> None:
    import base64

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gpuflex.serve.wire import SERVE_OUTPUT
    from mesh.codec import open_envelope

    model_dir = tiny_model_dir(tmp_path)
    mesh = serving_mesh(mesh_factory, 3, lambda i: SERVE.format(batch=2)
                        + (f'[serve.models]\ntiny = "{model_dir}"\n' if i < 2 else ""))
    url = api_url(mesh, 2)
    mesh.wait_until(lambda: servers_of(url, "tiny") == 2, timeout=60)
    prompts = [f"line {k}: " for k in range(24)]
    job_file = tmp_path / "infer.toml"
    job_file.write_text('kind = "inference"\nname = "batch"\nmodel = "tiny"\nmax_tokens = 24\nconcurrency = 4\n'
                        f"prompts = {json.dumps(prompts)}\n")
    from tests.integration.test_cli import gpuflex

    submitted = gpuflex("job", "submit", str(job_file), "--node", str(mesh.home(2)))
    assert submitted.returncode == 0, submitted.stderr
    run = submitted.stdout.strip()

    def done_count() -> int:
        rows = mesh.call(2, "serve_status")["runs"]
        return rows[0]["done"] if rows else 0

    mesh.wait_until(lambda: done_count() >= 3, timeout=120, interval=0.05)
    mesh.kill(2)
    lines_before = (mesh.home(2) / "inference" / run / "outputs.jsonl").read_text().splitlines()
    assert 3 <= len(lines_before) < 24  # killed midway
    mesh.start_node(2)  # the run resumes with the node
    mesh.wait_until(lambda: done_count() == 24, timeout=240)
    # A job like the others: listed by `gpuflex job list`, summarised by `gpuflex job status`.
    listed = gpuflex("job", "list", "--node", str(mesh.home(2)))
    assert listed.returncode == 0 and run in listed.stdout and "24/24" in listed.stdout, listed.stdout
    shown = gpuflex("job", "status", run[:8], "--node", str(mesh.home(2)), "--json")
    summary = json.loads(shown.stdout)
    assert summary["kind"] == "inference" and summary["state"] == "done" and summary["done"] == 24
    assert sum(summary["servers"].values()) == 24 and len(summary["servers"]) == 2, summary["servers"]
    assert summary["spec"]["model"] == "tiny" and summary["spec"]["prompts"] == 24
    assert mesh.call(2, "ledger", {"job": run}) == []  # no rounds: its log is the signed answers
    text = gpuflex("job", "status", run[:8], "--node", str(mesh.home(2))).stdout
    assert "batch inference" in text and "answers 24/24" in text and text.count("answers") == 3, text
    out = tmp_path / "answers.jsonl"
    written = gpuflex("job", "results", run[:8], "--out", str(out), "--node", str(mesh.home(2)))
    assert written.returncode == 0 and written.stdout.strip() == str(out), written.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(24))
    assert {r["server"] for r in rows} == {mesh.call(0, "status")["peer_id"], mesh.call(1, "status")["peer_id"]}
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for r in rows:
        # Signed by the server that answered.
        env = open_envelope(base64.b64decode(r["signed"]), expect_kind=SERVE_OUTPUT)
        assert env.sender == r["server"] and env.body["text"] == r["text"]
        ids = tok(r["prompt"], return_tensors="pt").input_ids
        ref = model.generate(input_ids=ids, max_new_tokens=24, do_sample=False, pad_token_id=256)
        assert r["text"] == tok.decode(ref[0, ids.shape[1]:], skip_special_tokens=True)  # as one node alone
