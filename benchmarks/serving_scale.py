"""Serving: scale-out over CPU-capped nodes, time to first token through a relay, the node's
scheduler beside CTranslate2 on the same model, and a serving node killed under load.

``python -m benchmarks.serving_scale [--only scale|relay|ct2|failover] [--json]``

1. **Scale-out.** Four serving node processes and one front node on loopback. Each serving
   node is put in a cgroup of its own holding it to the same CPU share (``--quota`` of one
   core, 0.2 by default, ``gpuflex.cpuquota``) once its models are loaded. The same weights are served under
   three names: ``s1`` by node 0 only, ``s2`` by nodes 0-1, ``s4`` by nodes 0-3, so one set of
   processes, quotas and clients measures 1, 2 and 4 servers side by side (in the order
   1, 2, 4, 4, 2, 1, so a drift in the machine's load weighs on both ends alike). ``--clients``
   concurrent clients each send ``--requests`` completions of ``--tokens`` tokens to the front
   node, which routes them over the mesh; each server batches at most ``--batch`` sequences, so
   more servers also mean more sequences at once. The clients (24 by default) must be at least
   twice the four servers' batches (4 x 3), so that each of four servers keeps a queue behind a
   full batch, as the one server does; a client refused with 429 (the routing node keeps at most
   12 of its requests in flight at one server) asks again. The four quotas together must stay
   well under the machine's cores, or the servers contend for the machine, not their quotas.
   Throughput is completion tokens per second of wall time; each process's CPU time per run
   (the clients' own process included) shows where the cores went, and the routing node's view
   of each server (its round trip and announced load) how the router chose.
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
4. **Failover.** ``--failover-servers`` node processes serve the tiny model as ``f``
   (``--failover-batch`` sequences a batch), one more routes; ``--failover-clients`` clients
   stream completions (``--failover-tokens`` tokens, greedy) through the routing node's API,
   ``--failover-requests`` each in turn. Once server 0 holds a full batch with more requests
   queued behind it and some text is streaming, it is SIGKILLed. Every request is counted:
   answered whole, ended with an error after its first piece of text (allowed: its server died
   mid-stream), or failed before it (must be none: the router retries those on a survivor),
   with the time from the kill to the next piece of text a survivor sent and to the first piece
   of each request that was still waiting then. Every wait is bounded; the processes are
   stopped however the run ends.
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

from benchmarks.common import add_json_flag, emit, format_table, log, stop_on_sigterm
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

def scale_names(i: int) -> list[str]:
    """The names node ``i`` serves the scale-out model under (node 4 routes only)."""
    return [f"s{n}" for n in (1, 2, 4) if i < n] if i < 4 else []


def node_toml(names: list[str], model_dir: Path, batch: int) -> str:
    models = "".join(f'{name} = "{model_dir}"\n' for name in names)
    return (f'[serve]\nhttp = "127.0.0.1:0"\nmax_batch = {batch}\nqueue = 64\nmax_new_tokens = 256\n'
            + (f"[serve.models]\n{models}" if models else ""))


@contextlib.contextmanager
def serving_nodes(tmp: Path, names: list[list[str]], batch: int, expect: dict[str, int]) -> Any:
    """Node processes on loopback, node ``i`` serving the tiny model (hidden 128, 2 layers) under
    ``names[i]`` (none: it only routes), one torch thread each; yields ``(mesh, url)`` once the
    last node's API (the routing node's) lists ``expect`` (model -> servers). Every process is
    stopped on the way out, however it is left."""
    import httpx

    from gpuflex.localmesh import LocalMesh

    with contextlib.ExitStack() as stack:
        model_dir = tmp / "m"
        model, tok = build_model(128, 2, 512)
        model.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        mesh = LocalMesh(tmp / "mesh", len(names), log_level="warning")
        stack.callback(mesh.close)
        # One torch thread per node: two threads spinning inside a quota of a few hundredths of
        # a core would spend it waiting on each other (a node started in its cgroup sizes its
        # threads to its quota; these are capped after loading, so they are told).
        stack.enter_context(_env("OMP_NUM_THREADS", "1"))
        for i, mine in enumerate(names):
            mesh.home(i).mkdir(parents=True, exist_ok=True)
            (mesh.home(i) / "node.toml").write_text(node_toml(mine, model_dir, batch))
        mesh.start(timeout=300)
        mesh.wait_connected(120)
        url = mesh.call(len(names) - 1, "status")["serve"]["http"]

        def ready() -> bool:
            rows = {r["id"]: r["servers"] for r in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
            return rows == expect

        mesh.wait_until(ready, timeout=300, what=f"the routing node listing {expect}")
        yield mesh, url


def load(url: str, model: str, clients: int, requests: int, tokens: int) -> dict[str, Any]:
    import httpx

    made: list[int] = []
    errors: list[str] = []
    busy: list[int] = []  # 429s asked again

    def client(c: int) -> None:
        with httpx.Client(timeout=600) as http:
            for k in range(requests):
                body = {"model": model, "prompt": f"Client {c} asks {k}: tell the tale.\n", "max_tokens": tokens,
                        "temperature": 0}
                deadline = time.monotonic() + 300
                while True:  # a 429 (every server busy, or as many of ours as it takes) is asked again
                    resp = http.post(f"{url}/v1/completions", json=body)
                    if resp.status_code != 429 or time.monotonic() > deadline:
                        break
                    busy.append(1)
                    time.sleep(0.2)
                if resp.status_code == 200:
                    made.append(resp.json()["usage"]["completion_tokens"])
                else:
                    errors.append(f"{resp.status_code} {resp.text[:200]}")

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, t0 + 900 - time.perf_counter()))
    wall = time.perf_counter() - t0
    return {"tokens": sum(made), "answers": len(made), "errors": len(errors), "first_error": errors[:1],
            "busy_retries": len(busy), "wall_s": round(wall, 2), "tok_s": round(sum(made) / wall, 2)}


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used, threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scale_out(quota: float, clients: int, requests: int, tokens: int, batch: int) -> dict[str, Any]:
    from gpuflex.cpuquota import CpuQuota, QuotaUnavailable

    if 4 * quota > 1.0:  # the servers' quotas must leave the routing node and the clients room
        log(f"scale-out: 4 servers x {quota} cores = {4 * quota:.2f} of this machine's "
            f"{os.cpu_count()} cores; quotas that add up to much more than half the machine "
            "measure the servers' contention for it, not scale-out")
    names = [scale_names(i) for i in range(5)]
    with tempfile.TemporaryDirectory(prefix="gpuflex-scale-bench-") as tmp, contextlib.ExitStack() as stack:
        mesh, url = stack.enter_context(serving_nodes(Path(tmp), names, batch, {"s1": 1, "s2": 2, "s4": 4}))
        try:
            quotas = [stack.enter_context(CpuQuota(quota, name="gpuflex-bench")) for _ in range(4)]
        except QuotaUnavailable as exc:
            return {"skipped": f"no CPU cgroup here: {exc}"}
        for q, i in zip(quotas, range(4), strict=True):
            q.add(mesh.procs[i].pid)
        for n in (1, 2, 4):  # warm each path once (first requests pay for lazy set-up)
            load(url, f"s{n}", 1, 1, 4)
        ids = {mesh.call(i, "status")["peer_id"]: i for i in range(4)}

        def seen_by_router() -> dict[str, Any]:
            """The routing node's view of each server: its round trip (ms), which weighs in the
            router's choice, and its announced load."""
            rows = mesh.call(4, "status")["serve"]["servers"]
            return {str(ids.get(r["peer"], "?")): {"rtt_ms": None if r["rtt_ms"] is None else round(r["rtt_ms"], 1),
                                                    "load": r["load"]} for r in rows}

        router_view = [seen_by_router()]
        runs = []
        for n in ORDER:
            log(f"scale-out: {clients} clients, {n} server(s)")
            before = [cpu_s(mesh.procs[i].pid) for i in range(5)]
            own = time.process_time()
            row = {"servers": n, **load(url, f"s{n}", clients, requests, tokens)}
            used = [round(cpu_s(mesh.procs[i].pid) - b, 2) for i, b in zip(range(5), before, strict=True)]
            row["front_cpu_share"] = round(used[4] / row["wall_s"], 3)  # cores the routing node used
            row["servers_cpu_share"] = [round(u / row["wall_s"], 3) for u in used[:4]]
            row["clients_cpu_share"] = round((time.process_time() - own) / row["wall_s"], 3)
            row["load_avg_1m"] = round(os.getloadavg()[0], 2)
            row["router_view"] = seen_by_router()
            runs.append(row)
        throttled = [q.throttled() for q in quotas]
    best = {n: statistics.mean(r["tok_s"] for r in runs if r["servers"] == n) for n in (1, 2, 4)}
    return {"quota_cores": quota, "clients": clients, "requests_per_client": requests, "tokens": tokens,
            "max_batch": batch, "runs": runs, "mean_tok_s": {str(n): round(v, 2) for n, v in best.items()},
            "speedup_2": round(best[2] / best[1], 2), "speedup_4": round(best[4] / best[1], 2),
            "throttled_periods": throttled, "router_view_before": router_view[0]}


# -- failover --------------------------------------------------------------------------------------

def stream_one(http: Any, url: str, body: dict[str, Any], rec: dict[str, Any] | None = None,
               clock: Any = time.perf_counter, busy_s: float = 60.0) -> dict[str, Any]:
    """One streamed completion through ``url``, recorded in ``rec`` as it goes (another thread
    may watch it): when it was sent, when each piece of text came, and how it ended: ``whole``
    (a finish reason and ``[DONE]``) or ``error`` (an error event, a refusal, or a broken
    stream) with the message; ``done`` once it has ended. A 429 (busy: try again shortly) is
    asked again, as clients do, for ``busy_s`` at most; ``busy`` counts them."""
    rec = {} if rec is None else rec
    rec.update({"sent": clock(), "times": [], "status": None, "end": None, "error": None, "finish": None,
                "busy": 0})

    def read(resp: Any) -> None:
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                if rec["finish"]:
                    rec["end"] = "whole"
                else:
                    rec["error"] = "[DONE] without a finish reason"
                return
            obj = json.loads(data)
            if "error" in obj:
                rec["error"] = str(obj["error"].get("message"))[:300]
                return
            choice = obj["choices"][0]
            if choice.get("text"):
                rec["times"].append(clock())
            if choice.get("finish_reason"):
                rec["finish"] = choice["finish_reason"]
        rec["error"] = "the stream ended without [DONE]"

    try:
        while True:
            with http.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as resp:
                rec["status"] = resp.status_code
                if resp.status_code == 200:
                    read(resp)
                    break
                resp.read()
                if resp.status_code != 429 or clock() - rec["sent"] >= busy_s:
                    rec["error"] = f"{resp.status_code} {resp.text[:300]}"
                    break
                rec["busy"] += 1
            time.sleep(0.2)
    except Exception as exc:  # a broken connection or a timeout: the request failed
        rec["error"] = f"{exc.__class__.__name__}: {exc}"[:300]
    finally:
        if rec["end"] is None:
            rec["end"] = "error"
        rec["done"] = clock()
    return rec


def failover_outcome(records: list[dict[str, Any]], killed_at: float | None) -> dict[str, Any]:
    """The failover figures from every request's record (``stream_one``) and the kill's time:
    requests sent, answered whole, ended with an error after their first token (allowed: the
    server died mid-stream) and failed before it (must be none); the wait from the kill to the
    next piece of text a survivor sent (one of a request answered whole, so not a piece the
    killed server had already sent), and to the first piece of each request still waiting then."""
    whole = [r for r in records if r["end"] == "whole"]
    after_first = [r for r in records if r["end"] != "whole" and r["times"]]
    before_first = [r for r in records if r["end"] != "whole" and not r["times"]]
    out: dict[str, Any] = {"sent": len(records), "whole": len(whole), "error_after_first": len(after_first),
                           "failed_before_first": len(before_first),
                           "errors_after_first": sorted({r["error"] for r in after_first})[:3],
                           "errors_before_first": sorted({r["error"] for r in before_first})[:3],
                           "text_pieces": sum(len(r["times"]) for r in records),
                           "busy_retries": sum(r.get("busy", 0) for r in records)}
    if killed_at is not None:
        streaming = [r for r in records if r["times"] and r["times"][0] <= killed_at < r["done"]]
        waiting = [r for r in records if r["sent"] <= killed_at and not (r["times"] and r["times"][0] <= killed_at)
                   and r["done"] > killed_at]
        nxt = [t for r in whole for t in r["times"] if t > killed_at]
        firsts = sorted(r["times"][0] - killed_at for r in waiting if r["times"])
        out.update({"streaming_at_kill": len(streaming), "waiting_at_kill": len(waiting),
                    "waiting_at_kill_answered_whole": sum(r["end"] == "whole" for r in waiting),
                    "kill_to_next_token_ms": round((min(nxt) - killed_at) * 1000, 1) if nxt else None,
                    "kill_to_waiting_first_token_ms_p50": round(statistics.median(firsts) * 1000, 1)
                    if firsts else None,
                    "kill_to_waiting_first_token_ms_max": round(firsts[-1] * 1000, 1) if firsts else None})
    out["ok"] = out["failed_before_first"] == 0 and killed_at is not None
    return out


def failover(servers: int, clients: int, requests: int, tokens: int, batch: int) -> dict[str, Any]:
    """``servers`` nodes serve one model as ``f``, one more routes; ``clients`` stream
    completions through the routing node's API, ``requests`` each in turn; server 0 is
    SIGKILLed once some requests are streaming and some wait in its queue."""
    import httpx

    names = [["f"] if i < servers else [] for i in range(servers + 1)]
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop = threading.Event()
    killed_at: float | None = None
    trigger: dict[str, Any] = {}

    with tempfile.TemporaryDirectory(prefix="gpuflex-failover-bench-") as tmp, \
            serving_nodes(Path(tmp), names, batch, {"f": servers}) as (mesh, url):
        ids = {mesh.call(i, "status")["peer_id"]: i for i in range(servers + 1)}
        load(url, "f", servers, 1, 4)  # warm each path once (first requests pay for lazy set-up)

        def client(c: int) -> None:
            with httpx.Client(timeout=httpx.Timeout(120, connect=10)) as http:
                for k in range(requests):
                    if stop.is_set():
                        return
                    body = {"model": "f", "prompt": f"Client {c} asks {k}: tell the tale.\n", "max_tokens": tokens,
                            "temperature": 0}
                    rec: dict[str, Any] = {"client": c, "k": k}
                    with lock:
                        records.append(rec)
                    stream_one(http, url, body, rec)

        def streaming() -> int:
            """Requests whose text has begun to come and that have not ended."""
            with lock:
                return sum(1 for r in records if r.get("times") and "done" not in r)

        threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        victim = 0
        deadline = time.monotonic() + 120
        log(f"failover: {clients} clients streaming through the routing node; waiting for server {victim} "
            "to hold requests streaming and queued")
        while time.monotonic() < deadline:
            try:
                row = mesh.call(victim, "status", timeout=5)["serve"]["models"][0]
            except Exception:  # a slow or failed control answer: ask again
                row = {"load": 0, "capacity": 0}
            # A full batch on the victim, more waiting in its queue, and text already streaming.
            if row["load"] > row["capacity"] >= 1 and (live := streaming()) >= 1:
                trigger = {"victim_load": row["load"], "victim_capacity": row["capacity"], "streaming": live}
                break
            time.sleep(0.02)
        else:
            trigger = {"timed_out": True}
        killed_at = time.perf_counter()
        mesh.kill(victim)
        log(f"failover: server {victim} SIGKILLed ({trigger})")
        for t in threads:  # the clients go on sending after the kill: new requests must avoid the dead server
            t.join(max(1.0, t0 + 600 - time.perf_counter()))
        stop.set()  # a client still hung sends nothing more
        hung = sum(t.is_alive() for t in threads)
        wall = time.perf_counter() - t0
        front = mesh.call(servers, "status")["serve"]
    for r in records:  # a client still waiting after the bounded join: its request failed
        if "done" not in r:
            r.setdefault("times", [])
            r.update({"end": "error", "error": "no end within the benchmark's bound", "done": time.perf_counter()})
    out = failover_outcome(records, killed_at)
    by_node = {f"node {ids.get(peer, '?')}": n for peer, n in sorted(front["served_tokens"].items(),
                                                                     key=lambda kv: ids.get(kv[0], 99))}
    out.update({"servers": servers, "clients": clients, "requests_per_client": requests, "tokens_per_request": tokens,
                "max_batch": batch, "killed_node": victim, "trigger": trigger, "clients_hung": hung,
                "wall_s": round(wall, 2), "kill_at_s": round(killed_at - t0, 2),
                "routing_node_served_tokens": by_node})
    out["ok"] = out["ok"] and hung == 0 and out["sent"] == clients * requests and not trigger.get("timed_out")
    out["verdict"] = (
        f"{'PASS' if out['ok'] else 'FAIL'}: {out['failed_before_first']} of {out['sent']} requests failed before "
        f"their first token ({out.get('waiting_at_kill', 0)} were waiting when server {victim} was killed, "
        f"{out.get('waiting_at_kill_answered_whole', 0)} of them answered whole); {out['error_after_first']} ended "
        f"mid-stream with an error; {out['whole']} answered whole"
        + ("" if hung == 0 else f"; {hung} clients still hung")
        + ("; the kill's trigger timed out" if trigger.get("timed_out") else ""))
    return out


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
                                              ("busy_retries", "429s asked again", "d"),
                                              ("front_cpu_share", "routing node cores", ".3f"),
                                              ("clients_cpu_share", "clients' cores", ".3f"),
                                              ("load_avg_1m", "load 1m", ".2f")]))
        parts.append(f"speed-up: 2 servers {s['speedup_2']}x, 4 servers {s['speedup_4']}x; "
                     f"throttled periods per server {s['throttled_periods']}")
    r = result.get("relay") or {}
    if "samples" in r:
        parts.append(format_table([r], [("samples", "samples", "d"), ("link", "link", ""),
                                        ("direct_ttft_ms_p50", "direct TTFT ms", ".1f"),
                                        ("relayed_ttft_ms_p50", "relayed TTFT ms", ".1f"),
                                        ("overhead_ms_p50", "overhead ms", ".1f")]))
    f = result.get("failover") or {}
    if "verdict" in f:
        parts.append(format_table([f], [
            ("servers", "servers", "d"), ("clients", "clients", "d"), ("sent", "sent", "d"),
            ("streaming_at_kill", "streaming at kill", "d"), ("waiting_at_kill", "waiting at kill", "d"),
            ("whole", "answered whole", "d"), ("error_after_first", "error after 1st token", "d"),
            ("failed_before_first", "failed before 1st token", "d"), ("busy_retries", "429s asked again", "d"),
            ("kill_to_next_token_ms", "kill to next token ms", ".1f"),
            ("kill_to_waiting_first_token_ms_max", "kill to waiting's 1st token ms (max)", ".1f")]))
        for err in f["errors_after_first"] + f["errors_before_first"]:
            parts.append(f"  error: {err}")
        parts.append(f"failover: {f['verdict']}")
    c = result.get("ct2") or {}
    if "ct2_tok_s" in c:
        parts.append(format_table([c], [("requests", "requests", "d"), ("new_tokens", "new tokens", "d"),
                                        ("threads", "threads", "d"), ("ct2_tok_s", "CTranslate2 tok/s", ".1f"),
                                        ("ours_tok_s", "gpuflex scheduler tok/s", ".1f"),
                                        ("ours_vs_ct2", "ours / CTranslate2", ".3f")]))
    for key in ("scale", "relay", "ct2", "failover"):
        if (result.get(key) or {}).get("skipped"):
            parts.append(f"{key}: skipped: {result[key]['skipped']}")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["scale", "relay", "ct2", "failover"], default=None)
    parser.add_argument("--quota", type=float, default=0.2, help="CPU share of each serving node, in cores")
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--ct2-requests", type=int, default=16)
    parser.add_argument("--failover-servers", type=int, default=3, choices=[2, 3, 4])
    parser.add_argument("--failover-clients", type=int, default=12)
    parser.add_argument("--failover-requests", type=int, default=3, help="completions each client streams in turn")
    parser.add_argument("--failover-tokens", type=int, default=96)
    parser.add_argument("--failover-batch", type=int, default=2)
    add_json_flag(parser)
    args = parser.parse_args()
    stop_on_sigterm()  # a terminated run still stops its node processes
    result: dict[str, Any] = {"load_avg_start": os.getloadavg()}
    if args.only in (None, "scale"):
        result["scale"] = scale_out(args.quota, args.clients, args.requests, args.tokens, args.batch)
    if args.only in (None, "relay"):
        log("relay: time to first token across two homes through the public node's relay")
        result["relay"] = relay(args.samples)
    if args.only in (None, "ct2"):
        log("ct2: CTranslate2 generate_batch beside the node's scheduler, same model and requests")
        result["ct2"] = ct2(args.ct2_requests, 64)
    if args.only in (None, "failover"):
        log("failover: a serving node SIGKILLed under streaming load")
        result["failover"] = failover(args.failover_servers, args.failover_clients, args.failover_requests,
                                      args.failover_tokens, args.failover_batch)
    result["load_avg_end"] = os.getloadavg()
    emit(result, args.json, render)
    if not args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
