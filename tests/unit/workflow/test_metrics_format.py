"""The Prometheus exposition: names, labels, cumulative buckets, and the tiny HTTP server."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import trio

from gpuflex.node.events import EventLog
from gpuflex.node.metrics_http import (
    MetricsAddrError,
    MetricsServer,
    MetricsState,
    parse_metrics_addr,
)

SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]\w*="([^"\\]|\\.)*",?)*\})? [-+0-9.eInf]+$')


def events() -> list[dict]:
    return [
        {"type": "round_committed", "job": "j1", "metrics": {"duration_s": 0.7}},
        {"type": "round_committed", "job": "j1", "metrics": {"duration_s": 3.0}},
        {"type": "rejected", "reason": "signature"},
        {"type": "rejected", "job": "j1"},
        {"type": "trained", "job": "j1", "samples": 120, "seconds": 0.5},
    ]


def parse(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def test_addr_forms() -> None:
    assert parse_metrics_addr("9464") == ("127.0.0.1", 9464)
    assert parse_metrics_addr(":9464") == ("127.0.0.1", 9464)
    assert parse_metrics_addr("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert parse_metrics_addr("[::1]:9000") == ("::1", 9000)
    for bad in ("nope", "1.2.3.4:x", "70000"):
        with pytest.raises(MetricsAddrError):
            parse_metrics_addr(bad)


def test_state_renders_every_family() -> None:
    state = MetricsState()
    for e in events():
        state.observe(e)
    text = state.render({"up": 2, "suspect": 1, "down": 0}, 1000, 2000, {"peer_id": 'p"1', "version": "0.1.0"})
    got = parse(text)
    assert got['gpuflex_peers{state="up"}'] == 2 and got['gpuflex_peers{state="down"}'] == 0
    assert got['gpuflex_rounds_committed_total{job="j1"}'] == 2
    assert got['gpuflex_round_duration_seconds_bucket{job="j1",le="0.5"}'] == 0
    assert got['gpuflex_round_duration_seconds_bucket{job="j1",le="1"}'] == 1
    assert got['gpuflex_round_duration_seconds_bucket{job="j1",le="5"}'] == 2
    assert got['gpuflex_round_duration_seconds_bucket{job="j1",le="+Inf"}'] == 2
    assert got['gpuflex_round_duration_seconds_sum{job="j1"}'] == pytest.approx(3.7)
    assert got['gpuflex_round_duration_seconds_count{job="j1"}'] == 2
    assert got["gpuflex_bytes_sent_total"] == 1000 and got["gpuflex_bytes_received_total"] == 2000
    assert got['gpuflex_updates_rejected_total{reason="signature"}'] == 1
    assert got['gpuflex_updates_rejected_total{reason="other"}'] == 1
    assert got['gpuflex_local_samples_per_second{job="j1"}'] == 240
    assert 'peer_id="p\\"1"' in text
    assert "# TYPE gpuflex_round_duration_seconds histogram" in text


async def http_get(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    return data


async def test_server_serves_metrics_and_only_metrics() -> None:
    log = EventLog()
    log.emit("trained", job="early", samples=10, seconds=1.0)  # before the server: from history
    runtime = SimpleNamespace(
        events=log, identity=SimpleNamespace(peer_id="12D3KooWtest"),
        mesh=SimpleNamespace(peers=SimpleNamespace(counts=lambda: {"up": 1, "suspect": 0, "down": 0, "peers": 1}),
                             bytes_sent=5, bytes_received=7))
    server = MetricsServer(runtime, "127.0.0.1:0")
    async with trio.open_nursery() as nursery:
        _host, port = await nursery.start(server.run)
        log.emit("round_committed", job="j", round=1, metrics={"duration_s": 1.5})
        await trio.sleep(0.05)
        reply = await http_get(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = reply.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.0 200") and b"version=0.0.4" in head
        got = parse(body.decode())
        assert got['gpuflex_rounds_committed_total{job="j"}'] == 1
        assert got['gpuflex_local_samples_per_second{job="early"}'] == 10
        assert got["gpuflex_bytes_received_total"] == 7
        assert (await http_get(port, b"GET /other HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 404")
        assert (await http_get(port, b"POST /metrics HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 405")
        assert (await http_get(port, b"garbage\r\n\r\n")).startswith(b"HTTP/1.0 400")
        nursery.cancel_scope.cancel()


def test_job_status_shows_each_members_work_in_the_last_round() -> None:
    from gpuflex.cli.job_cmd import format_status

    js = {"job_id": "j1", "name": "digits", "state": "running", "round": 4, "rounds": 8, "phase": "train",
          "coordinator": "12D3KooWAAAAAAAA", "is_coordinator": False, "role": "member", "members": [],
          "metrics": [], "work": [
              {"peer": "12D3KooWFastFast", "samples": 337, "device": "NVIDIA H100 bf16", "steps": 120,
               "samples_per_s": 3840.0, "compute_s": 1.0, "compute_share": 0.5},
              {"peer": "12D3KooWSlowSlow", "samples": 300, "device": "CPU ×1 fp32", "steps": 3,
               "samples_per_s": 96.0, "compute_s": 1.0, "compute_share": 0.5},
              {"peer": "12D3KooWOldOld", "samples": 200}]}
    lines = format_status(js).splitlines()
    assert any(line.startswith("work") and "round 4" in line for line in lines)
    fast = next(line for line in lines if "H100" in line)
    assert "120" in fast and "3840.0" in fast and "50%" in fast
    old = next(line for line in lines if "200" in line and "H100" not in line and "CPU" not in line)
    assert old.split()[-4:] == ["-", "-", "-", "-"]  # a round that recorded no work


def test_job_status_shows_the_bytes_each_round_moved() -> None:
    from gpuflex.cli.job_cmd import format_status

    row = {"loss": 1.0, "accuracy": 0.5, "train_loss": 1.2, "contributors": 3, "duration_s": 2.0}
    js = {"job_id": "j1", "name": "digits", "state": "running", "round": 2, "rounds": 8, "phase": "train",
          "coordinator": "12D3KooWAAAAAAAA", "is_coordinator": False, "role": "member", "members": [],
          "metrics": [{**row, "round": 1, "update_bytes": 3_000_000, "down_bytes": 500_000},
                      {**row, "round": 2, "update_bytes": 1_500_000, "down_bytes": 250_000}],
          "work": [{"peer": "12D3KooWFastFast", "samples": 337, "device": "cpu", "steps": 10,
                    "samples_per_s": 1.0, "compute_s": 1.0, "compute_share": 1.0, "update_bytes": 500_000}]}
    lines = format_status(js).splitlines()
    assert lines[next(i for i, line in enumerate(lines) if "up MB" in line) + 1].split()[-2:] == ["3.000", "0.500"]
    assert next(line for line in lines if "cpu" in line).split()[-1] == "0.500"
    total = next(line for line in lines if line.startswith("bytes"))
    assert "4.500 MB of updates up" in total and "2.250 MB down" in total  # 0.5 x 3 + 0.25 x 3
    js["metrics"][0].pop("update_bytes")  # a round from a node that did not record bytes
    assert not any(line.startswith("bytes") for line in format_status(js).splitlines())


def test_job_status_names_each_member_gone_because_the_job_failed_there() -> None:
    from gpuflex.cli.job_cmd import format_status

    js = {"job_id": "j1", "name": "digits", "state": "running", "round": 2, "rounds": 8, "phase": "train",
          "coordinator": "12D3KooWAAAAAAAA", "is_coordinator": False, "role": "member", "members": [],
          "metrics": [], "gone": [{"peer": "12D3KooWGoneGone", "reason": "cannot read\x1b[2J its data"},
                                  "not a row"]}
    gone = [line for line in format_status(js).splitlines() if line.startswith("gone")]
    assert len(gone) == 1 and "GoneGone" in gone[0] and "the job failed there (cannot read" in gone[0]
    assert "\x1b" not in gone[0]  # a peer's text, shown as text
