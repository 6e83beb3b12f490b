"""Streamed text never shows a stop string or half a character, and whatever is streamed adds
up to the final text; requests from the wire are bounded field by field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.serve import BadRequest, ServeError
from gpuflex.serve.directory import Directory, parse_announcement, parse_batches
from gpuflex.serve.request import MAX_PROMPT_CHARS, parse_request
from gpuflex.serve.settings import parse_serve
from gpuflex.serve.textstream import Finish, TextStream


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="abc\n", max_size=40), stop=st.text(alphabet="abc\n", min_size=1, max_size=3))
def test_streamed_pieces_add_up_to_the_text_before_the_first_stop(text: str, stop: str) -> None:
    chars = list(text)
    stream = TextStream(lambda ids: "".join(chars[: len(ids)]), (stop,))
    out = ""
    for n in range(1, len(chars) + 1):
        out += stream.feed(list(range(n)), eos=False, at_limit=n == len(chars))
        assert stop not in out
        if stream.finish is not None:
            break
    cut = text.find(stop)
    assert out == (text[:cut] if cut >= 0 else text)
    if chars:
        assert stream.finish is (Finish.STOP if cut >= 0 else Finish.LENGTH)


def test_half_a_character_waits_for_its_other_bytes() -> None:
    data = "né".encode()
    stream = TextStream(lambda ids: bytes(data[: len(ids)]).decode("utf-8", "replace"))
    assert stream.feed([0], eos=False, at_limit=False) == "n"
    assert stream.feed([0, 1], eos=False, at_limit=False) == ""
    assert stream.feed([0, 1, 2], eos=False, at_limit=True) == "é"


@pytest.mark.parametrize("body, words", [
    ([1], "JSON object"), ({"model": "../etc", "prompt": "x"}, "model"), ({"model": "m", "prompt": 3}, "prompt"),
    ({"model": "m", "prompt": "x" * (MAX_PROMPT_CHARS + 1)}, "characters"),
    ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"model": "m", "prompt": "x", "stop": ["a"] * 5}, "stop"), ({"model": "m", "prompt": "x", "seed": -1}, "seed"),
])
def test_bad_fields_are_refused_by_name(body: object, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        parse_request(body)


def test_serve_settings_name_the_bad_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ok = parse_serve({"models": {"a": {"job": "0123456789abcdef"}, "b": {"path": "m"}}}, tmp_path)
    assert ok.http == "127.0.0.1:8000" and ok.models[1].path == tmp_path / "m"
    for raw, key in (({"max_batch": 0}, "serve.max_batch"), ({"models": {"a": {"job": "x"}}}, "serve.models.a.job"),
                     ({"oops": 1}, "serve.oops"), ({"http": "nohost"}, "serve.http")):
        with pytest.raises(ServeError, match=key):
            parse_serve(raw, tmp_path)


async def test_the_least_loaded_server_is_chosen_latency_breaks_ties_and_a_failed_one_is_skipped() -> None:
    d = Directory("me")
    d.update("far", {"m": "ab" * 16}, 4, 1)
    d.update("busy", {"m": "ab" * 16}, 4, 4)
    d.update("near", {"m": "ab" * 16}, 4, 1)
    d.update("idle", {"m": "ab" * 16}, 4, 0)
    rtt = {"far": 90.0, "busy": 1.0, "near": 1.0, "idle": 400.0}
    assert d.choose("m", rtt) == ["idle", "near", "far", "busy"]
    d.failed("idle")
    assert d.choose("m", rtt)[0] == "near"
    assert d.choose("other", {}) == []
    with pytest.raises(ValueError):
        parse_announcement({"models": {"m": "not-a-hash"}, "capacity": 1, "load": 0})


async def test_a_slow_pinging_idle_server_is_chosen_before_a_neighbour_with_one_request_more() -> None:
    """Latency weighs at most half a request: a server whose pings take 326 ms (a throttled
    one) is still chosen while it has fewer requests than its neighbours, and passed over only
    among equally loaded ones."""
    d = Directory("me")
    d.update("slow", {"m": "ab" * 16}, 4, 0)
    d.update("a", {"m": "ab" * 16}, 4, 1)
    d.update("b", {"m": "ab" * 16}, 4, 0)
    rtt = {"slow": 326.0, "a": 1.0, "b": 1.0}
    assert d.choose("m", rtt) == ["b", "slow", "a"]
    d.update("slow", {"m": "ab" * 16}, 4, 1)
    assert d.choose("m", rtt) == ["b", "a", "slow"]
    d.update("a", {"m": "ab" * 16}, 4, 2)
    d.update("b", {"m": "ab" * 16}, 4, 2)
    assert d.choose("m", rtt)[0] == "slow"  # one request fewer outweighs any round trip


async def test_a_server_s_requests_are_this_node_s_live_count_plus_the_others_it_announced() -> None:
    """The announced load is up to a second old: a server that has just finished this node's
    requests is not taken for busy until it speaks again, and other nodes' requests there,
    which only its announcement tells, still count."""
    d = Directory("me")
    d.update("a", {"m": "ab" * 16}, 4, 0)
    d.update("b", {"m": "ab" * 16}, 4, 1)  # one request of another node's
    for _ in range(3):
        d.routed("a")
    d.update("a", {"m": "ab" * 16}, 4, 3)  # a announces this node's three
    assert d.servers["a"].requests() == 3 and d.choose("m", {})[0] == "b"
    for _ in range(3):
        d.returned("a")  # they are answered before a speaks again
    assert d.servers["a"].requests() == 0 and d.choose("m", {}) == ["a", "b"]
    d.routed("b")
    d.update("b", {"m": "ab" * 16}, 4, 4)  # b: this node's one and three of others'
    d.routed("b")
    assert d.servers["b"].requests() == 5


async def test_a_server_is_weighed_by_the_model_s_own_batch_not_its_other_models() -> None:
    """A node serving three models (capacity 9) and one serving two (capacity 6), each with a
    batch of 3 for ``m``, holding equally many requests, are equally loaded for ``m``: the
    first is not filled to half as much again while the second's batch stands short."""
    d = Directory("me")
    d.update("three", {"m": "ab" * 16, "x": "cd" * 16, "y": "ef" * 16}, 9, 3, batches={"m": 3, "x": 3, "y": 3})
    d.update("two", {"m": "ab" * 16, "x": "cd" * 16}, 6, 2, batches={"m": 3, "x": 3})
    assert d.choose("m", {"three": 1.0, "two": 1.0}) == ["two", "three"]  # 2/3 against 3/3, not 3/9
    d.update("old", {"m": "ab" * 16}, 4, 3)  # an older node that names no batches: its capacity
    assert d.servers["old"].batch("m") == 4
    body = {"models": {"m": "ab" * 16}, "capacity": 3, "load": 0}
    assert parse_batches(body, body["models"]) == {}
    assert parse_batches({**body, "batches": {"m": 3}}, body["models"]) == {"m": 3}
    for bad in ({"other": 3}, {"m": 0}, {"m": True}, [3]):
        with pytest.raises(ValueError):
            parse_batches({**body, "batches": bad}, body["models"])
