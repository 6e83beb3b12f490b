"""Robust rules inside the group tree versus flat-robust, and norm bounding, on tiny vectors."""

from __future__ import annotations

import numpy as np
import pytest

from aggregation.tree import build_tree, children
from gpuflex.jobspec import JobSpec, JobSpecError
from gpuflex.node.core.pipeline import MeanReducer, RobustReducer, describe_rule, make_reducer

BASE = {"model": "mlp", "data": "sklearn-digits"}


def spec(**kw: object) -> JobSpec:
    return JobSpec.from_dict({**BASE, **kw})


def tree_reduce(job: JobSpec, parent: dict[str, str | None], root: str, updates: dict[str, float]) -> float:
    """What the round driver computes: every leader reduces its group, bottom-up, via make_reducer."""

    def reduce(node: str) -> float:
        red = make_reducer(job, parent[node] is None)
        red.add(np.array([updates[node]], dtype=np.float32), 1.0, node)
        for kid in children(parent, node):
            value = reduce(kid) if children(parent, kid) else updates[kid]
            red.add(np.array([value], dtype=np.float32), 1.0, kid)
        return float(red.result()[0])

    return reduce(root)


def nine(attackers: dict[int, float]) -> tuple[dict[str, str | None], dict[str, float]]:
    names = [f"p{i}" for i in range(9)]
    updates = {n: 1.0 + 0.01 * i for i, n in enumerate(names)}
    for i, value in attackers.items():
        updates[names[i]] = value
    return build_tree(names, 3, "p0"), updates


def test_make_reducer_picks_by_rule() -> None:
    assert isinstance(make_reducer(spec(), True), MeanReducer)
    assert isinstance(make_reducer(spec(rule="median"), False), RobustReducer)
    assert isinstance(make_reducer(spec(norm_bound=2.0), False), RobustReducer)
    assert describe_rule(spec(rule="trimmed-mean", rule_params={"beta": 0.2}))["params"] == {"beta": 0.2}


def test_median_in_tree_survives_one_attacker_per_group() -> None:
    # The tree of nine in groups of 3 (fan-out 2): p0 leads p1 and p3; p1 leads p2 and p6; p3
    # leads p4, p5; p6 leads p7, p8. One attacker in each reduction: p1, p4, p7.
    parent, updates = nine({1: 100.0, 4: 100.0, 7: 100.0})
    assert tree_reduce(spec(rule="median"), parent, "p0", updates) == pytest.approx(1.04, abs=0.05)
    assert tree_reduce(spec(), parent, "p0", updates) > 20  # plain FedAvg is dragged away


def test_tree_breaks_where_flat_robust_holds() -> None:
    """4 of 9 attackers (< half) placed as majorities of 2 of the 3 groups break the tree."""
    parent, updates = nine({1: 100.0, 2: 100.0, 4: 100.0, 5: 100.0})
    # p1 (100) with p2 (100) and p3 with p4, p5 (100): both of the root's children send 100
    assert tree_reduce(spec(rule="median"), parent, "p0", updates) == pytest.approx(100.0)
    flat = build_tree(list(updates), len(updates), "p0")  # flat-robust: one group under the root
    assert tree_reduce(spec(rule="median", aggregation_mode="flat-robust"), flat, "p0", updates) < 1.1


def test_norm_bound_clip_and_reject() -> None:
    vecs = [np.array([3.0, 4.0]), np.array([0.6, 0.8]), np.array([0.0, 1.0]), np.array([300.0, 400.0])]
    clip = make_reducer(spec(norm_bound=2.0, norm_bound_mode="clip"), False)
    reject = make_reducer(spec(norm_bound=2.0, norm_bound_mode="reject"), False)
    for i, v in enumerate(vecs):
        clip.add(v.astype(np.float32), 1.0, f"p{i}")
        reject.add(v.astype(np.float32), 1.0, f"p{i}")
    # median norm is (1 + 5) / 2 = 3, bound 6: [300, 400] is clipped to norm 6, or dropped
    assert clip.result() == pytest.approx(np.mean([[3, 4], [0.6, 0.8], [0, 1], [3.6, 4.8]], axis=0), rel=1e-5)
    assert reject.result() == pytest.approx(np.mean([[3, 4], [0.6, 0.8], [0, 1]], axis=0), rel=1e-5)
    assert isinstance(reject, RobustReducer) and reject.rejected == ["p3"]


def test_krum_falls_back_to_median_in_small_groups() -> None:
    red = make_reducer(spec(rule="krum", rule_params={"f": 1}), False)
    for i, v in enumerate((0.2, 0.7, 100.0)):
        red.add(np.array([v], dtype=np.float32), 1.0, f"p{i}")
    assert red.result().tolist() == pytest.approx([0.7])
    assert isinstance(red, RobustReducer) and red.applied == "median"
    big = make_reducer(spec(rule="krum", rule_params={"f": 1}), True)
    for i, v in enumerate((0.2, 0.7, 1.0, 0.8, 50.0)):
        big.add(np.array([v], dtype=np.float32), 1.0, f"p{i}")
    assert big.result().tolist() == pytest.approx([0.8]) and big.applied == "krum"


def test_robust_reducer_rejects_bad_input() -> None:
    red = make_reducer(spec(rule="median"), False)
    red.add(np.zeros(2, dtype=np.float32), 1.0, "a")
    with pytest.raises(ValueError, match="wrong size"):
        red.add(np.zeros(3, dtype=np.float32), 1.0, "b")
    with pytest.raises(ValueError, match="non-finite"):
        red.add(np.array([np.nan, 0], dtype=np.float32), 1.0, "c")


@pytest.mark.parametrize(("fields", "where"), [
    ({"rule": "krum"}, "rule"),
    ({"rule": "trimmed-mean", "rule_params": {"beta": 0.7}}, "rule"),
    ({"aggregation_mode": "flat-robust"}, "aggregation_mode"),
    ({"secure_aggregation": True, "rule": "median"}, "secure_aggregation"),
    ({"secure_aggregation": True, "norm_bound": 3.0}, "secure_aggregation"),
    ({"dp_clip": 1.0}, "dp_clip"),
    ({"dp_epsilon_budget": 4.0}, "dp_epsilon_budget"),
    ({"rule_params": {"f": "one"}}, "rule_params"),
])
def test_job_rejects_bad_trust_settings(fields: dict[str, object], where: str) -> None:
    with pytest.raises(JobSpecError) as info:
        spec(**fields)
    assert where in {name for name, _ in info.value.errors}


def test_template_still_parses_with_new_fields() -> None:
    from gpuflex.jobspec import example_job_toml

    job = JobSpec.from_toml_text(example_job_toml())
    assert job.rule == "mean" and not job.secure_aggregation and not job.uses_dp


def test_flat_plan_for_flat_robust() -> None:
    members = [f"p{i}" for i in range(7)]
    parent = build_tree(members, len(members), "p0")
    assert all(parent[m] == "p0" for m in members[1:])
    assert parent["p0"] is None
