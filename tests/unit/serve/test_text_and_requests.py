"""Streamed text never shows a stop string or half a character, and whatever is streamed adds
up to the final text; requests from the wire are bounded field by field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.serve import BadRequest, ServeError
from gpuflex.serve.directory import Directory, parse_announcement
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


async def test_the_least_loaded_nearby_server_is_chosen_and_a_failed_one_is_skipped() -> None:
    d = Directory("me")
    d.update("far", {"m": "ab" * 16}, 4, 0)
    d.update("busy", {"m": "ab" * 16}, 4, 4)
    d.update("near", {"m": "ab" * 16}, 4, 1)
    assert d.choose("m", {"far": 90.0, "busy": 1.0, "near": 1.0}) == ["near", "far", "busy"]
    d.failed("near")
    assert d.choose("m", {"far": 90.0, "busy": 1.0, "near": 1.0})[0] == "far"
    assert d.choose("other", {}) == []
    with pytest.raises(ValueError):
        parse_announcement({"models": {"m": "not-a-hash"}, "capacity": 1, "load": 0})


async def test_a_slow_pinging_server_is_chosen_once_its_neighbours_hold_a_full_batch_more() -> None:
    """Latency weighs at most one full batch: a server whose pings take 326 ms (a throttled
    one) is passed over while idle neighbours have room, and chosen once they are a batch ahead."""
    d = Directory("me")
    d.update("slow", {"m": "ab" * 16}, 4, 0)
    d.update("a", {"m": "ab" * 16}, 4, 2)
    d.update("b", {"m": "ab" * 16}, 4, 3)
    rtt = {"slow": 326.0, "a": 1.0, "b": 1.0}
    assert d.choose("m", rtt) == ["a", "b", "slow"]
    d.update("a", {"m": "ab" * 16}, 4, 5)
    d.update("b", {"m": "ab" * 16}, 4, 6)
    assert d.choose("m", rtt)[0] == "slow"  # a and b a full batch and more ahead: 1.25+ against 1.0
