"""What a server announces of its figures is bounded on the way in, and what status shows of
each server (and of this node over all its models) is what was announced."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.serve.directory import STAT_KEYS, Directory, parse_stats
from gpuflex.serve.stats import ServeStats, node_row

good_value = st.one_of(st.none(), st.floats(min_value=0, max_value=1e9), st.integers(0, 10**9))
bad_value = st.one_of(st.floats(max_value=-1e-9), st.floats(min_value=1e9 + 1), st.just(math.nan),
                      st.just(math.inf), st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=2))


@settings(max_examples=200, deadline=None)
@given(values=st.fixed_dictionaries({k: good_value for k in STAT_KEYS}))
def test_announced_figures_in_bounds_are_kept_as_floats(values: dict) -> None:
    parsed = parse_stats({"stats": values})
    assert set(parsed) == set(STAT_KEYS)
    for key, value in values.items():
        assert parsed[key] == (None if value is None else float(value))


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(STAT_KEYS), value=bad_value)
def test_an_announced_figure_out_of_bounds_or_of_another_type_is_refused(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        parse_stats({"stats": {key: value}})


def test_an_older_node_announces_no_figures_and_a_huge_map_is_refused() -> None:
    assert parse_stats({"models": {}}) == {} and parse_stats("not a map") == {}
    with pytest.raises(ValueError):
        parse_stats({"stats": {f"k{i}": 0 for i in range(100)}})
    with pytest.raises(ValueError):
        parse_stats({"stats": [1, 2]})


async def test_status_rows_show_each_fresh_server_with_its_figures() -> None:
    d = Directory("me")
    d.update("me", {"m": "ab" * 16}, 8, 2, {"rps": 1.0, "tokens_per_s": 9.0, "ttft_ms_p50": 40.0,
                                            "latency_ms_p50": 300.0})
    d.update("peer", {"m": "ab" * 16, "n": "cd" * 16}, 4, 1, {})
    d.update("idle", {}, 4, 0)  # routes only: not a server
    rows = {r["peer"]: r for r in d.server_rows({"peer": 12.5})}
    assert set(rows) == {"me", "peer"}
    assert rows["me"]["self"] and rows["me"]["rtt_ms"] is None and rows["me"]["rps"] == 1.0
    assert rows["peer"]["models"] == ["m", "n"] and rows["peer"]["rtt_ms"] == 12.5
    assert rows["peer"]["load"] == 1 and rows["peer"]["capacity"] == 4 and rows["peer"]["tokens_per_s"] is None
    d.routed("peer")
    assert d.server_rows({})[1]["in_flight"] == 1  # this node's requests there, live


def test_a_nodes_figures_add_its_models_rates_and_weigh_their_medians_by_requests() -> None:
    a, b = ServeStats(), ServeStats()
    for _ in range(3):
        a.first_token(0.010)
        a.finished(0.100)
    b.first_token(0.050)
    b.finished(0.500)
    a.tokens(30)
    b.tokens(10)
    row = node_row([a.row(), b.row()])
    assert row["rps"] == pytest.approx((3 + 1) / 60, abs=1e-3)
    assert row["tokens_per_s"] == pytest.approx(40 / 60, abs=0.01)
    assert row["ttft_ms_p50"] == pytest.approx((10 * 3 + 50 * 1) / 4, abs=0.1)
    assert row["latency_ms_p50"] == pytest.approx((100 * 3 + 500) / 4, abs=0.1)
    assert node_row([]) == {"rps": 0, "tokens_per_s": 0, "ttft_ms_p50": None, "latency_ms_p50": None}


async def test_a_server_that_streams_stays_in_the_directory_though_its_announcements_are_late(
        autojump_clock: object) -> None:
    import trio

    from gpuflex.serve.directory import FRESH_S

    d = Directory("me")
    d.update("busy", {"m": "ab" * 16}, 4, 4)
    d.update("quiet", {"m": "ab" * 16}, 4, 0)
    await trio.sleep(FRESH_S * 0.6)
    d.heard("busy")  # it streamed part of an answer: alive, however late its next beat
    d.heard("stranger")  # never announced: hearing it adds nothing
    await trio.sleep(FRESH_S * 0.6)
    assert d.choose("m", {}) == ["busy"] and d.serves("m")
    assert "stranger" not in d.servers
    await trio.sleep(FRESH_S)
    assert d.choose("m", {}) == [] and not d.serves("m")
