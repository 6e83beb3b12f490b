"""The presence message's codec (gpuflex.node.presence): what ``make_presence`` writes,
``parse_presence`` reads back as typed values, and any other body either parses to bounded,
typed values or is a ``WireError`` — never anything else, whatever a peer sends."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.node.core.ledger import HEAD_CHARS, LedgerClaim
from gpuflex.node.core.messages import PRESENCE
from gpuflex.node.presence import (
    FAILED_REASON_CHARS,
    PRESENCE_MARKS,
    JobPresence,
    make_presence,
    parse_presence,
)
from mesh.codec import WireError, WireReason, open_envelope, seal
from mesh.identity import Identity
from mesh.reachability import Reachability

ME = Identity.generate()


class Source:
    """What presence reads of one job's driver, set by hand."""

    def __init__(self, rate: float, head: str, weight: int, preparing: bool, passes: int) -> None:
        self._rate, self._head, self.weight, self.preparing, self.passes_round = rate, head, weight, preparing, passes

    def throughput(self) -> float:
        return self._rate

    def head(self) -> str:
        return self._head


heads = st.text("0123456789abcdef", min_size=HEAD_CHARS, max_size=HEAD_CHARS)
sources = st.builds(Source, st.floats(0.0, 1e6), heads, st.integers(0, 10**6), st.booleans(), st.integers(0, 100))


@given(jobs=st.dictionaries(st.text("abcdef0123456789", min_size=1, max_size=12),
                            st.tuples(sources, st.integers(0, 10**6)), max_size=6),
       failed=st.dictionaries(st.text("xyz", min_size=1, max_size=8), st.text(max_size=300), max_size=4))
@settings(max_examples=60, deadline=None)
def test_what_make_presence_writes_parse_presence_reads_back(jobs: dict[str, Any], failed: dict[str, str]) -> None:
    drivers = {j: src for j, (src, _) in jobs.items()}
    active = {j: committed for j, (_, committed) in jobs.items()}
    failed = {j: why for j, why in failed.items() if j not in active}
    got = parse_presence(open_envelope(make_presence(ME, drivers, active, failed)))
    assert got.sender == ME.peer_id and set(got.jobs) == set(active)
    for job, seen in got.jobs.items():
        src = drivers[job]
        assert seen.claim == LedgerClaim(active[job], src.weight, src.head())
        assert seen.rate == (round(src.throughput(), 3) or None)
        assert seen.preparing == (src.preparing and job in list(active)[:PRESENCE_MARKS])
        assert seen.passes == (src.passes_round or None)
    assert set(got.failed) == set(failed) and all(len(why) <= FAILED_REASON_CHARS for why in got.failed.values())


scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
           | st.binary(max_size=8))
wire = st.recursive(scalars,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=20)
bodies = st.dictionaries(st.sampled_from(["jobs", "heads", "weights", "rates", "passes", "preparing", "failed",
                                          "reach"]),
                         wire | st.dictionaries(st.text("ab", min_size=1, max_size=2), wire, max_size=4), max_size=8)


@given(body=bodies)
@settings(max_examples=200, deadline=None)
def test_any_presence_body_parses_to_typed_bounded_values_or_is_a_wire_error(body: dict[str, Any]) -> None:
    try:
        got = parse_presence(open_envelope(seal(ME, PRESENCE, body)))
    except WireError as exc:
        assert exc.reason == WireReason.GARBLED and not isinstance(body.get("jobs"), dict)
        return
    assert isinstance(body.get("jobs"), dict)
    for job, seen in got.jobs.items():
        assert isinstance(job, str) and isinstance(seen, JobPresence)
        claim = seen.claim
        assert claim.height is None or (type(claim.height) is int and claim.height >= 0)
        assert claim.weight is None or (type(claim.weight) is int and claim.weight >= 0)
        assert claim.head is None or (isinstance(claim.head, str) and len(claim.head) == HEAD_CHARS)
        assert seen.rate is None or (isinstance(seen.rate, float) and seen.rate > 0)
        assert seen.passes is None or (type(seen.passes) is int and seen.passes >= 1)
    assert len(got.failed) <= PRESENCE_MARKS
    assert all(isinstance(why, str) and len(why) <= FAILED_REASON_CHARS for why in got.failed.values())
    assert got.reach is None or (isinstance(got.reach, Reachability) and got.reach != Reachability.UNKNOWN)


@pytest.mark.parametrize("junk", [True, -1, "9", 1.5, None, [3]])
def test_a_height_that_is_no_count_claims_nothing(junk: Any) -> None:
    claim = LedgerClaim.from_wire(junk, 10**9, "x" * HEAD_CHARS)
    assert claim.height is None and claim.weight == 10**9


@pytest.mark.parametrize("reach", [Reachability.PUBLIC, Reachability.RELAYED, Reachability.PRIVATE])
def test_presence_says_whether_its_sender_can_be_dialled(reach: Reachability) -> None:
    got = parse_presence(open_envelope(make_presence(ME, {}, {}, {"j": "x"}, None, reach)))
    assert got.reach == reach


@pytest.mark.parametrize("said", [None, Reachability.UNKNOWN])
def test_a_presence_that_does_not_know_its_reachability_says_nothing_of_it(said: Reachability | None) -> None:
    frame = make_presence(ME, {}, {}, {"j": "x"}, None, said)
    assert "reach" not in open_envelope(frame).body and parse_presence(open_envelope(frame)).reach is None
