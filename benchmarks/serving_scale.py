"""Serving: scale-out over CPU-capped nodes, time to first token through a relay, and the node's
scheduler beside CTranslate2 on the same model.

``python -m benchmarks.serving_scale [--only scale|relay|ct2] [--json]``

1. **Scale-out.** Four serving node processes and one front node on loopback. Each serving
   node is put in a cgroup of its own holding it to the same CPU share (``--quota`` of one
   core, ``gpuflex.cpuquota``) once its models are loaded. The same weights are served under
   three names: ``s1`` by node 0 only, ``s2`` by nodes 0-1, ``s4`` by nodes 0-3, so one set of
   processes, quotas and clients measures 1, 2 and 4 servers side by side (in the order
   1, 2, 4, 4, 2, 1, so a drift in the machine's load weighs on both ends alike). ``--clients``
   concurrent clients each send ``--requests`` completions of ``--tokens`` tokens to the front
   node, which routes them over the mesh; each server batches at most ``--batch`` sequences, so
   more servers also mean more sequences at once. Throughput is completion tokens per second of
   wall time; each process's CPU time per run shows where the cores went.
2. **Relay.** The NAT topology of the tests (network namespaces, root only): a model served in
   one home, asked for from a node in another home whose only path to it is the public node's
   relay. Time to first byte of a streamed completion (the API sends its headers with the first
   token) asked in home B through the relay, and asked of the serving node's own API in home A
   (direct), alternating; medians.
3. **CTranslate2.** The batching benchmark's llama-shaped model (random weights, byte
   vocabulary) converted with CTranslate2's own converter (float32), and the same requests
   (``--ct2-requests`` of 64 tokens, greedy, exactly 64 tokens each) answered by CTranslate2's
   ``Generator.generate_batch`` (all at once, ``max_batch_size`` 8, the better of one thread
   and as many as torch has) and by the node's scheduler with 8 concurrent clients, one after
   the other here. CTranslate2's greedy tokens are checked against ``generate``'s first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_json_flag, emit, format_table, log
from benchmarks.serving import batching_model_dir, build_model, tiny_serving_mesh

ORDER = (1, 2, 4, 4, 2, 1)


@contextlib.contextmanager
def _env(key: str, value: str) -> Any:
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


# -- scale-out -------------------------------------------------------------------------------------

def node_toml(i: int, model_dir: Path, batch: int) -> str:
    names = [f"s{n}" for n in (1, 2, 4) if i < n] if i < 4 else []
    models = "".join(f'{name} = "{model_dir}"\n' for name in names)
    return (f'[serve]\nhttp = "127.0.0.1:0"\nmax_batch = {batch}\nqueue = 64\nmax_new_tokens = 256\n'
            + (f"[serve.models]\n{models}" if models else ""))


def load(url: str, model: str, clients: int, requests: int, tokens: int) -> dict[str, Any]:
    import httpx

    made: list[int] = []
    errors: list[str] = []

    def client(c: int) -> None:
        with httpx.Client(timeout=600) as http:
            for k in range(requests):
                body = {"model": model, "prompt": f"Client {c} asks {k}: tell the tale.\n", "max_tokens": tokens,
                        "temperature": 0}
                for _ in range(20):  # a 429 (every server busy) is asked again
                    resp = http.post(f"{url}/v1/completions", json=body)
                    if resp.status_code != 429:
                        break
                    time.sleep(0.2)
                if resp.status_code == 200:
                    made.append(resp.json()["usage"]["completion_tokens"])
                else:
                    errors.append(f"{resp.status_code} {resp.text[:200]}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    wall = time.perf_counter() - t0
    return {"tokens": sum(made), "answers": len(made), "errors": len(errors), "first_error": errors[:1],
            "wall_s": round(wall, 2), "tok_s": round(sum(made) / wall, 2)}


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used, threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scale_out(quota: float, clients: int, requests: int, tokens: int, batch: int) -> dict[str, Any]:
    import httpx

    from gpuflex.cpuquota import CpuQuota, QuotaUnavailable
    from gpuflex.localmesh import LocalMesh

    with tempfile.TemporaryDirectory(prefix="gpuflex-scale-bench-") as tmp, contextlib.ExitStack() as stack:
        model_dir = Path(tmp) / "m"
        model, tok = build_model(128, 2, 512)
        model.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        mesh = LocalMesh(Path(tmp) / "mesh", 5, log_level="warning")
        stack.callback(mesh.close)
        # One torch thread per node: two threads spinning inside a quota of a few hundredths of
        # a core would spend it waiting on each other (a node started in its cgroup sizes its
        # threads to its quota; these are capped after loading, so they are told).
        stack.enter_context(_env("OMP_NUM_THREADS", "1"))
        for i in range(5):
            mesh.home(i).mkdir(parents=True, exist_ok=True)
            (mesh.home(i) / "node.toml").write_text(node_toml(i, model_dir, batch))
        mesh.start(timeout=300)
        mesh.wait_connected(120)
        url = mesh.call(4, "status")["serve"]["http"]

        def ready() -> bool:
            rows = {r["id"]: r["servers"] for r in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
            return rows == {"s1": 1, "s2": 2, "s4": 4}

        mesh.wait_until(ready, timeout=300)
        try:
            quotas = [stack.enter_context(CpuQuota(quota, name="gpuflex-bench")) for _ in range(4)]
        except QuotaUnavailable as exc:
            return {"skipped": f"no CPU cgroup here: {exc}"}
        for q, i in zip(quotas, range(4), strict=True):
            q.add(mesh.procs[i].pid)
        for n in (1, 2, 4):  # warm each path once (first requests pay for lazy set-up)
            load(url, f"s{n}", 1, 1, 4)
        runs = []
        for n in ORDER:
            log(f"scale-out: {clients} clients, {n} server(s)")
            before = [cpu_s(mesh.procs[i].pid) for i in range(5)]
            row = {"servers": n, **load(url, f"s{n}", clients, requests, tokens)}
            used = [round(cpu_s(mesh.procs[i].pid) - b, 2) for i, b in zip(range(5), before, strict=True)]
            row["front_cpu_share"] = round(used[4] / row["wall_s"], 3)  # cores the routing node used
            row["servers_cpu_share"] = [round(u / row["wall_s"], 3) for u in used[:4]]
            runs.append(row)
        throttled = [q.throttled() for q in quotas]
    best = {n: statistics.mean(r["tok_s"] for r in runs if r["servers"] == n) for n in (1, 2, 4)}
    return {"quota_cores": quota, "clients": clients, "requests_per_client": requests, "tokens": tokens,
            "max_batch": batch, "runs": runs, "mean_tok_s": {str(n): round(v, 2) for n, v in best.items()},
            "speedup_2": round(best[2] / best[1], 2), "speedup_4": round(best[4] / best[1], 2),
            "throttled_periods": throttled}


# -- relay -----------------------------------------------------------------------------------------

def first_byte_s(host: Any, url: str, prompt: str) -> float:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True})
    res = host.run("curl", "-sN", "-o", "/dev/null", "-w", "%{time_starttransfer}", f"{url}/v1/completions",
                   "-H", "content-type: application/json", "-d", body, timeout=120)
    return float(res.stdout.strip())


def relay(samples: int) -> dict[str, Any]:
    from gpuflex.testing.nat import NatTopology, NetnsUnavailable

    try:
        topo = NatTopology((1, 1), uplink_mbit=20, random_ports=True)
    except NetnsUnavailable as exc:
        return {"skipped": f"no NAT topology here: {exc}"}
    hosts = [topo.public, topo.homes[0].hosts[0], topo.homes[1].hosts[0]]
    with tempfile.TemporaryDirectory(prefix="gpuflex-relay-bench-") as tmp:
        mesh = tiny_serving_mesh(Path(tmp), 3, server=1, placement=lambda i: hosts[i].placement(),
                                 log_level="warning")
        try:
            mesh.start(timeout=300)
            mesh.wait_until(lambda: all(mesh.call(i, "status")["nat"]["reachability"] == "relayed"
                                        for i in (1, 2)), timeout=180)
            urls = {i: mesh.call(i, "status")["serve"]["http"] for i in (1, 2)}
            mesh.wait_until(lambda: '"tiny"' in hosts[2].run("curl", "-s", f"{urls[2]}/v1/models").stdout,
                            timeout=120)
            server = mesh.call(1, "status")["peer_id"]
            link = {p["peer_id"]: p["connection"] for p in mesh.call(2, "peers")}.get(server)
            for i in (1, 2):
                first_byte_s(hosts[i], urls[i], "warm up")
            direct, via = [], []
            for k in range(samples):
                direct.append(first_byte_s(hosts[1], urls[1], f"sample {k}"))
                via.append(first_byte_s(hosts[2], urls[2], f"sample {k}"))
        finally:
            for i in list(mesh.procs):
                with contextlib.suppress(Exception):
                    mesh.call(i, "shutdown", timeout=2)
            mesh.close()
            topo.close()
    d, v = statistics.median(direct) * 1000, statistics.median(via) * 1000
    return {"samples": samples, "link": link, "direct_ttft_ms_p50": round(d, 1), "relayed_ttft_ms_p50": round(v, 1),
            "overhead_ms_p50": round(v - d, 1)}


# -- CTranslate2 -----------------------------------------------------------------------------------

def ct2(requests: int, new_tokens: int) -> dict[str, Any]:
    try:
        import ctranslate2
    except ImportError:
        return {"skipped": "ctranslate2 is not installed (pip install 'gpuflex[bench-serving]')"}
    import torch

    from benchmarks.serving import scheduler_run

    with tempfile.TemporaryDirectory(prefix="gpuflex-ct2-bench-") as tmp:
        model_dir, (model, tok) = batching_model_dir(Path(tmp), 256, 4)
        out = Path(tmp) / "ct2"
        ctranslate2.converters.TransformersConverter(str(model_dir)).convert(str(out), quantization="float32")
        config = json.loads((out / "config.json").read_text())
        config["bos_token"] = config["bos_token"] or config["eos_token"]  # the byte tokenizer names none
        (out / "config.json").write_text(json.dumps(config))
        threads = torch.get_num_threads()
        prompts = [f"Request {i}: tell the story of the {i}th king.\n" for i in range(requests)]
        starts = [tok.convert_ids_to_tokens(tok(p).input_ids) for p in prompts]
        # The same model, checked: CTranslate2's greedy tokens for the first prompt are generate's.
        ids = tok(prompts[0], return_tensors="pt").input_ids
        with torch.inference_mode():
            ref = model.generate(input_ids=ids, max_new_tokens=16, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
        by_threads = {}
        for n in sorted({1, threads}):  # its best of one thread and torch's count
            gen = ctranslate2.Generator(str(out), device="cpu", inter_threads=1, intra_threads=n)
            check = gen.generate_batch(starts[:1], max_length=16, sampling_topk=1, include_prompt_in_result=False,
                                       end_token=[])
            agree = check[0].sequences_ids[0] == ref.tolist()
            t0 = time.perf_counter()
            results = gen.generate_batch(starts, max_batch_size=8, max_length=new_tokens, min_length=new_tokens,
                                         sampling_topk=1, include_prompt_in_result=False, end_token=[])
            by_threads[n] = (time.perf_counter() - t0, sum(len(r.sequences_ids[0]) for r in results), agree)
            del gen
        best = min(by_threads, key=lambda n: by_threads[n][0] / max(1, by_threads[n][1]))
        ct2_s, ct2_tokens, agree = by_threads[best]
        ours_s, ours_tokens = scheduler_run(model, tok, prompts, new_tokens, 8)
    return {"requests": requests, "new_tokens": new_tokens, "threads": threads, "ctranslate2": ctranslate2.__version__,
            "ct2_threads": best, "ct2_agrees_with_generate": agree,
            "ct2_tok_s_by_threads": {str(n): round(t / s, 1) for n, (s, t, _) in by_threads.items()},
            "ct2_tokens": ct2_tokens, "ct2_s": round(ct2_s, 2), "ct2_tok_s": round(ct2_tokens / ct2_s, 1),
            "ours_tokens": ours_tokens, "ours_s": round(ours_s, 2), "ours_tok_s": round(ours_tokens / ours_s, 1),
            "ours_vs_ct2": round((ours_tokens / ours_s) / (ct2_tokens / ct2_s), 3)}


def render(result: dict[str, Any]) -> str:
    parts = []
    s = result.get("scale") or {}
    if s.get("runs"):
        parts.append(format_table(s["runs"], [("servers", "servers", "d"), ("answers", "answers", "d"),
                                              ("errors", "errors", "d"), ("tokens", "tokens", "d"),
                                              ("wall_s", "wall s", ".2f"), ("tok_s", "tok/s", ".2f"),
                                              ("front_cpu_share", "routing node cores", ".3f")]))
        parts.append(f"speed-up: 2 servers {s['speedup_2']}x, 4 servers {s['speedup_4']}x; "
                     f"throttled periods per server {s['throttled_periods']}")
    r = result.get("relay") or {}
    if "samples" in r:
        parts.append(format_table([r], [("samples", "samples", "d"), ("link", "link", ""),
                                        ("direct_ttft_ms_p50", "direct TTFT ms", ".1f"),
                                        ("relayed_ttft_ms_p50", "relayed TTFT ms", ".1f"),
                                        ("overhead_ms_p50", "overhead ms", ".1f")]))
    c = result.get("ct2") or {}
    if "ct2_tok_s" in c:
        parts.append(format_table([c], [("requests", "requests", "d"), ("new_tokens", "new tokens", "d"),
                                        ("threads", "threads", "d"), ("ct2_tok_s", "CTranslate2 tok/s", ".1f"),
                                        ("ours_tok_s", "gpuflex scheduler tok/s", ".1f"),
                                        ("ours_vs_ct2", "ours / CTranslate2", ".3f")]))
    for key in ("scale", "relay", "ct2"):
        if (result.get(key) or {}).get("skipped"):
            parts.append(f"{key}: skipped: {result[key]['skipped']}")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["scale", "relay", "ct2"], default=None)
    parser.add_argument("--quota", type=float, default=0.1, help="CPU share of each serving node, in cores")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--ct2-requests", type=int, default=16)
    add_json_flag(parser)
    args = parser.parse_args()
    result: dict[str, Any] = {"load_avg_start": os.getloadavg()}
    if args.only in (None, "scale"):
        result["scale"] = scale_out(args.quota, args.clients, args.requests, args.tokens, args.batch)
    if args.only in (None, "relay"):
        log("relay: time to first token across two homes through the public node's relay")
        result["relay"] = relay(args.samples)
    if args.only in (None, "ct2"):
        log("ct2: CTranslate2 generate_batch beside the node's scheduler, same model and requests")
        result["ct2"] = ct2(args.ct2_requests, 64)
    result["load_avg_end"] = os.getloadavg()
    emit(result, args.json, render)
    if not args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
