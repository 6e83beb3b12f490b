"""How often a watched peer's NodeInfo is looked up again, by what it says of its reachability:
a settled (public or relayed) peer's record changes seldom, and re-reading it every half minute
was most of a settled node's idle traffic."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mesh.discovery import INFO_CHECKING_S, INFO_REFRESH_S, INFO_SETTLED_S, Discovery
from mesh.health import UP, PeerRecord


def _discovery() -> Discovery:
    node: Any = SimpleNamespace(config=SimpleNamespace(info_retry_s=10.0))
    return Discovery(node)


@pytest.mark.parametrize(("reach", "period"), [("unknown", INFO_CHECKING_S), ("private", INFO_REFRESH_S),
                                               ("public", INFO_SETTLED_S), ("relayed", INFO_SETTLED_S),
                                               ("nonsense", INFO_CHECKING_S)])
def test_a_watched_peer_is_looked_up_again_after_its_reachability_period(reach: str, period: float) -> None:
    d = _discovery()
    rec = PeerRecord("p", first_seen=0.0, state=UP, info={"reachability": reach})
    d._info_tried["p"] = 100.0
    assert not d.info_due(rec, 100.0 + period - 0.5, {"p"})
    assert d.info_due(rec, 100.0 + period + 0.5, {"p"})
    assert not d.info_due(rec, 100.0 + 10 * INFO_SETTLED_S, set())  # not watched: never again

