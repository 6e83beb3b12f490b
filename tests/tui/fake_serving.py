"""The ``serve`` block of a serving node's ``status``, as gpuflex.serve.service builds it: this
node serves one model, two peers serve it too (one of them also a second model), and one batch
inference job is half done. Shared by the dashboard's and the portal's fakes."""

from __future__ import annotations

from typing import Any

from tests.tui.fake_source import SELF, peer_id

RUN_ID = "5e1f" * 4
#: A redundancy check's verdict, as the node reports it (peer 2 lied and a third server agreed).
VERDICT = "servers 00000002 and 00000001 disagree on 'bard': greedy tokens differ from position 0; " \
          "00000002 disagrees with a third server too and is penalised"
FAILED_WHY = "[bold red]no safetensors[/] <b>here</b>"  # text from the node is shown, not read as markup


def figures(rps: float, tps: float, ttft: float | None, latency: float | None) -> dict[str, Any]:
    return {"rps": rps, "tokens_per_s": tps, "ttft_ms_p50": ttft, "latency_ms_p50": latency}


def serve_block() -> dict[str, Any]:
    bard = {"name": "bard", "hash": "ab" * 32, "source": "job 0123abcd", "load": 3, "capacity": 8,
            "requests": 120, "tokens": 7_680, "errors": 2, **figures(1.5, 96.0, 41.0, 820.0),
            "fit": {"device": "cuda:0", "device_name": "NVIDIA H200", "dtype": "bfloat16", "batch": 8,
                    "asked_batch": 16, "memory_mb": 512.0, "asked_memory_mb": 512.0, "free_mb": 120_000.0,
                    "probe_ms": 420.0}}
    servers = [
        {"peer": SELF, "self": True, "models": ["bard"], "load": 3, "capacity": 8, "rtt_ms": None,
         **figures(1.5, 96.0, 41.0, 820.0)},
        {"peer": peer_id(1), "self": False, "models": ["bard", "tiny"], "load": 7, "capacity": 8, "rtt_ms": 12.5,
         **figures(2.25, 143.5, 63.0, 1210.0)},
        {"peer": peer_id(2), "self": False, "models": ["bard"], "load": 0, "capacity": 4, "rtt_ms": 48.0,
         **figures(0.0, 0.0, None, None)},
    ]
    return {
        "http": "http://127.0.0.1:8000",
        "models": [bard],
        "failed": {"poet": FAILED_WHY},
        "mesh_models": {"bard": {"hashes": ["ab" * 32], "servers": [s["peer"] for s in servers]},
                        "tiny": {"hashes": ["cd" * 32], "servers": [peer_id(1)]}},
        "servers": servers,
        "taken_in": {"requests": 40, "tokens": 2_000, "errors": 0, **figures(0.5, 30.0, 55.0, 900.0)},
        "served_tokens": {SELF: 1200, peer_id(1): 800},
        "runs": [{"run_id": RUN_ID, "name": "summaries", "kind": "inference", "model": "bard", "done": 12,
                  "total": 24, "state": "running", "error": ""}],
        "redundancy": {"level": 2, "checked": 9, "mismatches": {peer_id(1): 1, peer_id(2): 1},
                       "penalised": {peer_id(2): 1}, "reports": [VERDICT]},
    }
