"""`gpuflex status` and `gpuflex job status` print serving rows and batch inference jobs as
text: figures as numbers or a dash, and anything else escaped, never a terminal control."""

from __future__ import annotations

from gpuflex.cli.job_cmd import format_inference
from gpuflex.cli.query import serve_lines

ESC = "\x1b[2J\x1b]0;pwned\x07"


def test_each_server_of_the_mesh_gets_a_line_with_its_figures() -> None:
    serve = {"servers": [
        {"peer": "12D3KooWAAAAAAAAAAAAAAAAself", "self": True, "models": ["bard"], "load": 2, "capacity": 8,
         "rtt_ms": None, "rps": 1.5, "tokens_per_s": 96.0, "ttft_ms_p50": 41.0, "latency_ms_p50": 820.0},
        {"peer": "12D3KooWBBBBBBBBBBBBBBBBpeer", "self": False, "models": ["bard", ESC], "load": "x",
         "capacity": 4, "rtt_ms": 12.5, "rps": None, "tokens_per_s": "fast", "ttft_ms_p50": None,
         "latency_ms_p50": None},
    ]}
    mine, theirs = serve_lines(serve)
    assert "(this node) bard: load 2/8, 1.50 req/s, 96.0 tok/s, first token 41ms, latency 820ms" in mine
    assert "rtt" not in mine
    assert "load -/4, - req/s, - tok/s, first token -ms, latency -ms, rtt 12ms" in theirs
    assert "\x1b" not in theirs and "\x07" not in theirs


def test_a_batch_inference_job_prints_its_answers_and_servers_as_text() -> None:
    out = format_inference({"job_id": "5e1f5e1f", "name": ESC, "state": "running", "done": 12, "total": 24,
                            "model": "bard", "max_tokens": 64, "temperature": 0.0,
                            "servers": {"12D3KooWAAAAAAAAAAAAAAAAaaaa": 7, "12D3KooWBBBBBBBBBBBBBBBBbbbb": 5},
                            "error": ESC})
    assert "answers 12/24" in out and "batch inference" in out and out.count(" answers") == 3
    assert "\x1b" not in out and "\x07" not in out
    assert format_inference({"job_id": "x", "servers": "not a map"}).count("server ") == 0
