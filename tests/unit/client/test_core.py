"""The control-API client core, without I/O: what a request looks like, what a reply means,
lines out of chunks, which events pass, and how long to wait before the next attempt."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.client.core import (
    MAX_LINE,
    ControlError,
    LineBuffer,
    Refused,
    RetrySchedule,
    Subscription,
    Unreachable,
    encode_request,
    parse_line,
    result_of,
)

PARAMS = st.dictionaries(st.text(max_size=8), st.none() | st.integers() | st.text(max_size=20), max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=20), PARAMS)
def test_a_request_is_one_json_line_the_node_reads_back(method: str, params: dict[str, Any]) -> None:
    line = encode_request("ab" * 32, method, params)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_line(line[:-1]) == {"token": "ab" * 32, "method": method, "params": params}


def test_replies_become_results_refusals_or_unreachable() -> None:
    assert result_of({"ok": True, "result": [1, 2]}) == [1, 2]
    with pytest.raises(Refused, match="unknown job"):
        result_of({"ok": False, "error": "unknown job 'x'"})
    with pytest.raises(Unreachable, match="unauthorized"):  # a stale token: worth a retry
        result_of({"ok": False, "error": "unauthorized"})
    for bad, why in ((b"{nope", "not JSON"), (b"[1]", "not a JSON object"), (b"x" * (MAX_LINE + 1), "over")):
        with pytest.raises(Unreachable, match=why):
            parse_line(bad)
    assert issubclass(Unreachable, ControlError) and issubclass(Refused, ControlError)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=6), st.data())
def test_lines_come_out_whole_however_the_bytes_are_chunked(lines: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    buf, out = LineBuffer(), []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        if end > start:
            buf.feed(stream[start:end])
        while (line := buf.line()) is not None:
            out.append(line)
    assert out == lines


def test_a_closed_stream_is_unreachable() -> None:
    with pytest.raises(Unreachable, match="closed"):
        LineBuffer().feed(b"")


def test_the_retry_schedule_steps_through_its_delays_and_starts_again_after_a_success() -> None:
    schedule = RetrySchedule((0.5, 1.0, 5.0))
    assert [schedule.next_delay() for _ in range(5)] == [0.5, 1.0, 5.0, 5.0, 5.0]
    schedule.succeeded()
    assert schedule.next_delay() == 0.5
    for bad in ((), (-1.0,), (float("nan"),)):
        with pytest.raises(ValueError):
            RetrySchedule(bad)


def test_a_subscription_passes_each_event_once_across_replays() -> None:
    sub = Subscription((0.1, 1.0))
    sub.subscribed({"ok": True, "result": "subscribed"})
    history = [{"event": {"seq": i, "ts": 100.0 + i, "type": "x"}} for i in range(3)]
    assert [sub.event(m) for m in history] == [m["event"] for m in history]
    assert sub.next_delay() == 0.1 and sub.next_delay() == 1.0
    sub.subscribed({"ok": True, "result": "subscribed"})  # a reconnect replays the history
    assert sub.next_delay() == 0.1
    restarted = {"event": {"seq": 0, "ts": 200.0, "type": "node_started"}}  # seq from zero again
    assert [sub.event(m) for m in [*history, restarted, {"ping": 1}]] == [None, None, None, restarted["event"], None]
    with pytest.raises(Refused):
        sub.subscribed({"ok": False, "error": "unknown method 'events'"})


def test_the_blocking_client_reports_a_node_that_is_not_there(tmp_path: Any) -> None:
    from gpuflex.client import ControlClient, locate

    with pytest.raises(Unreachable, match="no node is running"):
        locate(tmp_path)
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "control.json").write_text(json.dumps({"host": "127.0.0.1", "port": port}))
    (tmp_path / "control.token").write_text("ab" * 32)
    with pytest.raises(Unreachable, match="no node answers"):
        ControlClient.for_home(tmp_path, timeout=2.0)


def test_the_blocking_client_reports_a_node_that_reset_the_connection(tmp_path: Any) -> None:
    """A node told to stop exits at once: the next request on its connection meets a reset,
    which is one ``Unreachable`` (a ControlError, as every caller expects), and closing the
    connection afterwards raises nothing. Both were raw socket errors, and a test mesh's
    teardown failed on them."""
    import struct

    from gpuflex.client import ControlClient
    from gpuflex.client.core import Endpoint

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        client = ControlClient(Endpoint("127.0.0.1", server.getsockname()[1], "ab" * 32, tmp_path), timeout=5.0)
        conn, _ = server.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # closed with a reset, as by a process that is gone
        with pytest.raises(Unreachable):
            for _ in range(3):  # the first write may still be taken by the kernel
                client.call("status")
        client._file.write(b"left in the buffer\n")  # what close() would flush to a gone node
        client.close()
