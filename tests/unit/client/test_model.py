"""The one view model of the control API's JSON: any JSON parses, every string is clipped by
one rule, and the dashboard and the portal read through the same types."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.client import model
from gpuflex.client.model import (
    LINE,
    MAX_ADDRS,
    MAX_TEXT,
    NAME,
    WORD,
    Event,
    GoneMember,
    Job,
    LedgerRound,
    Peer,
    Status,
    clip,
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=400),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20,
)
KEYS = ["peer_id", "state", "rtt_ms", "info", "node_info", "reachability", "connection", "job_id", "name", "round",
        "rounds", "phase", "metrics", "members", "contributors", "samples", "peer", "accelerators", "mesh", "addrs",
        "legacy", "seq", "ts", "type", "message", "job", "waiting", "stalled", "work", "steps", "ram_bytes", "gone",
        "reason"]
RECORDS = st.dictionaries(st.sampled_from(KEYS), JSON, max_size=12) | JSON


def strings(value: Any) -> list[str]:
    """Every string a parsed value holds, through dataclasses, tuples and mappings."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [s for name in value.__dataclass_fields__ if name != "spec" for s in strings(getattr(value, name))]
    return []


@settings(max_examples=40, deadline=None)
@given(RECORDS)
def test_any_json_parses_and_every_string_is_clipped(raw: Any) -> None:
    parsed = [Peer.parse(raw), Job.parse(raw), LedgerRound.parse(raw), Status.parse(raw), Event.parse(raw)]
    assert all(len(s) <= MAX_TEXT for p in parsed for s in strings(p))
    peer, job, _, status, event = parsed
    assert peer.state in model.PEER_STATES and peer.reachability in model.REACHABILITY
    assert peer.connection in model.LINKS and status.reachability in model.REACHABILITY
    assert 0.0 <= job.progress <= 1.0 and 0.0 <= job.round_progress() <= 1.0
    assert len(status.addrs) <= MAX_ADDRS and isinstance(event.seq, int)


def test_one_clipping_rule_by_kind_of_text() -> None:
    assert clip("x" * 500, WORD) == "x" * (WORD - 1) + "…"
    assert clip("short", NAME) == "short" and clip(None) == "" and clip(12) == ""
    job = Job.parse({"job_id": "j" * 200, "state": "s" * 200, "waiting": "w" * 1000})
    assert (len(job.job_id), len(job.state), len(job.waiting)) == (NAME, WORD, LINE)


def test_gone_members_keep_the_rows_that_name_a_peer_each_clipped() -> None:
    """A node older than ``gone`` sends none; a hostile or broken one sends rows of any shape:
    those that name no peer are skipped, the rest read by the one clipping rule (escaping is
    each view's own)."""
    assert Job.parse({"job_id": "j"}).gone == ()
    assert Job.parse({"job_id": "j", "gone": "everyone"}).gone == ()
    job = Job.parse({"job_id": "j", "gone": [
        {"peer": "12D3KooWgone", "reason": "[Errno 2] No such file or directory: '<path>'"},
        None, "12D3KooWbare", ["12D3KooWlist"], {"reason": "no peer"}, {"peer": 7, "reason": "not an id"},
        {"peer": "", "reason": "empty id"},
        {"peer": "p" * 500, "reason": "<script>alert(1)</script>\x1b[2J" + "r" * 1000},
        {"peer": "12D3KooWquiet", "reason": {"nested": True}},
    ]})
    assert [g.peer[:12] for g in job.gone] == ["12D3KooWgone", "p" * 12, "12D3KooWquie"]
    first, hostile, quiet = job.gone
    assert first == GoneMember("12D3KooWgone", "[Errno 2] No such file or directory: '<path>'")
    assert len(hostile.peer) == NAME and hostile.peer.endswith("…")
    assert len(hostile.reason) == LINE and hostile.reason.startswith("<script>alert(1)</script>\x1b[2J")
    assert quiet.reason == ""


def test_numbers_that_are_not_finite_count_as_absent() -> None:
    peer = Peer.parse({"peer_id": "p", "rtt_ms": float("nan"), "rounds_contributed": float("inf")})
    assert peer.rtt_ms is None and peer.rounds_contributed == 0
    assert Event.parse({"seq": True, "round": float("-inf")}).round is None


def test_reachability_is_the_rows_else_its_node_infos() -> None:
    assert Peer.parse({"reachability": "relayed", "info": {"reachability": "public"}}).reachability == "relayed"
    assert Peer.parse({"reachability": "unknown", "info": {"reachability": "public"}}).reachability == "public"
    assert Peer.parse({"reachability": "<b>", "info": {}}).reachability == "unknown"
    status = Status.parse({"node_info": {"reachability": "private"}})
    assert status.reachability == "private"


def test_the_dashboard_and_the_portal_read_the_same_model() -> None:
    import gpuflex_web.model
    import tui.model

    for name in ("Peer", "Job", "LedgerRound", "Status", "Event"):
        assert getattr(tui.model, name) is getattr(gpuflex_web.model, name) is getattr(model, name)


def test_the_serving_view_reads_peer_text_and_numbers_by_the_same_rules() -> None:
    """Servers heard from the mesh: non-finite numbers are absent (no ``int(nan)`` crash), and
    names and lists are bounded like every other view's."""
    from gpuflex.client.model import MAX_ITEMS, NAME
    from gpuflex.serve.view import Serving

    view = Serving.from_status({"serve": {"servers": [{
        "peer": "p" * 500, "load": float("nan"), "capacity": float("inf"), "rtt_ms": float("inf"),
        "rps": float("nan"), "models": ["m"] * (MAX_ITEMS + 5)}]}})
    (server,) = view.servers
    assert len(server.peer) == NAME and server.peer.endswith("…")
    assert server.load == 0 and server.capacity == 0 and server.rtt_ms is None and server.figures.rps is None
    assert len(server.models) == MAX_ITEMS
