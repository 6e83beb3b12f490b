"""Work that reaches an ancestor past its own leader, and the leader too, counts exactly once
(``Collector.add_past``): whatever order the copies, the leader's partial and the ancestor's
word to the leader (``taken_above``) come in, the root never refuses the leader's partial, and
it ends holding each delivered member's update once, with the mean of exactly those."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.node.collector import Collector
from gpuflex.node.core.messages import Partial, Plan, Update
from gpuflex.node.core.pipeline import MeanReducer

ROOT, LEADER = "root", "leader"


def plan_of(members: list[str]) -> Plan:
    parent: dict[str, str | None] = {ROOT: None, LEADER: ROOT, **dict.fromkeys(members, LEADER)}
    return Plan(job="j", round=1, attempt=0, coordinator=ROOT, base_hash="b", prev_result="", members=tuple(parent),
                parent=parent, train_deadline=0.0, reduce_slack_s=1.0, env=cast(Any, None))


def update(peer: str, samples: int) -> Update:
    return Update(job="j", round=1, peer=peer, base_hash="b", samples=samples, delta_hash="", delta_size=1,
                  metrics={}, env=cast(Any, None))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_work_that_reached_both_its_leader_and_the_root_counts_once(data: st.DataObject) -> None:
    k = data.draw(st.integers(1, 4), label="members")
    members = [f"m{i}" for i in range(k)]
    samples = {p: data.draw(st.integers(1, 50)) for p in [LEADER, *members]}
    value = {p: float(i + 1) for i, p in enumerate([LEADER, *members])}
    routes = {p: data.draw(st.sampled_from(["leader", "root", "both"]), label=p) for p in members}
    events = [(p, to) for p in members for to in ("leader", "root") if routes[p] in (to, "both")]
    events.append((LEADER, "partial"))
    order = data.draw(st.permutations(events), label="order")
    plan = plan_of(members)
    root = Collector(plan, ROOT, MeanReducer(), deadline=10.0)
    leader = Collector(plan, LEADER, MeanReducer(), deadline=10.0)
    leader.add_update(update(LEADER, samples[LEADER]), np.array([value[LEADER]]))
    sent = False
    for peer, to in order:
        if to == "leader":
            if leader.accepts(peer):  # refused once closed, or once the root said it took it
                leader.add_update(update(peer, samples[peer]), np.array([value[peer]]))
        elif to == "root":
            assert root.went_past(peer)
            if root.accepts(peer):
                root.add_update(update(peer, samples[peer]), np.array([value[peer]]))
                leader.taken_above({peer})  # the root's word to the leader (Taken)
        else:  # the leader sends its partial: everything it holds
            leader.close()
            ups = list(leader.updates)
            covers = {u.peer for u in ups} | {LEADER}
            assert not root.overlaps(covers), f"the root refused an honest partial: {order}"
            part = Partial(job="j", round=1, attempt=0, leader=LEADER, samples=leader.samples, delta_hash="",
                           updates=[], partials=[], env=cast(Any, None))
            root.add_partial(part, leader.acc.result(), ups)  # the leader's mean, weighing its samples
            sent = True
    assert sent
    root.close()
    counted = [u.peer for u in root.updates] + [u.peer for u in root.within]
    assert sorted(counted) == sorted(set(counted)), f"a contribution counted twice: {counted}"
    delivered = {p for p, to in order if to == "root"} | {u.peer for u in root.within}
    assert set(counted) == delivered | {LEADER}, "work delivered to the root or inside the partial was lost"
    weights = {p: samples[p] for p in counted}
    expected = sum(weights[p] * value[p] for p in counted) / sum(weights.values())
    assert np.isclose(root.acc.result()[0], expected)
    assert root.samples == sum(weights.values())
