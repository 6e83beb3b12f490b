"""Which jobs a node runs: built-ins, allowed plug-ins, configured data, accepted publishers,
caps; and the node's memory of what it refused (under trio's mock clock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gpuflex.jobpolicy import JobPolicy, RefusalKind, pattern_regex
from gpuflex.jobspec import JobSpec
from gpuflex.node.admission import CAP_RETRY_S, REFUSED_MEMORY, Admission
from gpuflex.node.events import EventLog
from gpuflex.nodeconfig import (
    NodeConfig,
    NodeConfigError,
    load_node_config,
    parse_accept,
    with_flags,
)
from mesh.identity import Identity

ME, ALICE, MALLORY = (Identity.generate().peer_id for _ in range(3))
DIGITS = {"model": "digits-cnn", "data": "sklearn-digits"}


def spec(**fields: Any) -> JobSpec:
    return JobSpec.from_dict({**DIGITS, **fields})


def policy(**flags: Any) -> JobPolicy:
    return JobPolicy(with_flags(NodeConfig(), **flags), own_id=ME)


def test_patterns_match_whole_paths_with_star_for_modules_or_one_function_name() -> None:
    assert pattern_regex("mylab.models:*").match("mylab.models:make")
    # '*' in the function part is one name: never an attribute path through what a module imports.
    assert not pattern_regex("mylab.models:*").match("mylab.models:os.abort")
    assert not pattern_regex("mylab.models:*").match("mylab.models:Zoo.make")
    assert pattern_regex("mylab.models:Zoo.*").match("mylab.models:Zoo.make")
    assert not pattern_regex("mylab.*:*").match("mylab.models:os.abort")
    assert not pattern_regex("mylab.models:*").match("mylab.modelsx:make")
    assert not pattern_regex("mylab.models:make").match("mylab.models:make_evil")
    assert pattern_regex("mylab.*:*").match("mylab.a.b:c") and not pattern_regex("mylab.*:*").match("mylabx:c")
    assert not pattern_regex("my?ab:[x]").match("myXab:x")  # only '*' is special


def test_only_built_ins_run_unless_the_operator_allows_a_plug_in() -> None:
    bare = policy()
    assert bare.content_refusal(spec()) is None
    assert bare.content_refusal(spec(rule="median")) is None
    for field, path in (("model", "os:abort"), ("data", "pickle:loads"), ("train_fn", "subprocess:run"),
                        ("partitioner", "mylab.split:by_site"), ("rule", "builtins:eval")):
        refusal = bare.content_refusal(spec(**{field: path}))
        assert refusal is not None and refusal.kind == RefusalKind.PLUGIN, field
        assert f"{field} '{path}'" in str(refusal) and "--allow-plugin" in str(refusal)
    allowed = policy(allow_plugins=["mylab.*:*"])
    assert allowed.content_refusal(spec(model="mylab.nets:small", partitioner="mylab.split:by_site")) is None
    assert allowed.content_refusal(spec(model="mylab.nets:small", rule="os:abort")) is not None
    assert not allowed.allows_everything and policy(allow_plugins=["*:*"]).allows_everything


def test_file_data_sets_must_be_configured_here(tmp_path: Path) -> None:
    refusal = policy().content_refusal(spec(model="cifar10-cnn", data="cifar10"))
    assert refusal is not None and refusal.kind == RefusalKind.DATA and "--data cifar10=PATH" in str(refusal)
    assert policy(data=[f"cifar10={tmp_path}"]).content_refusal(spec(model="cifar10-cnn", data="cifar10")) is None
    llm = {"model": "pretrained", "data": "shakespeare", "partition": "groups",
           "llm": {"pretrained": "tinyllama", "tokenizer": "model"}}
    with_text = policy(data=[f"shakespeare={tmp_path / 'play.txt'}"])
    refusal = with_text.content_refusal(JobSpec.from_dict(llm))
    assert refusal is not None and "pretrained model 'tinyllama'" in str(refusal)


def test_publishers_and_caps() -> None:
    only_alice = policy(accept=ALICE)
    assert only_alice.refusal(spec(), ALICE) is None and only_alice.refusal(spec(), ME) is None  # own jobs too
    refusal = only_alice.refusal(spec(), MALLORY)
    assert refusal is not None and refusal.kind == RefusalKind.PUBLISHER and MALLORY in str(refusal)
    capped = policy(max_jobs=5, max_jobs_per_publisher=2)
    assert capped.refusal(spec(), ALICE, {ALICE: 1, ME: 2}) is None
    refusal = capped.refusal(spec(), ALICE, {ALICE: 2})
    assert refusal is not None and refusal.transient and "already has 2 unfinished jobs" in str(refusal)
    assert capped.refusal(spec(), ME, {ME: 4}) is None  # a node's own jobs count towards the total only
    refusal = capped.refusal(spec(), ME, {ME: 3, ALICE: 2})
    assert refusal is not None and "already holds 5 unfinished jobs" in str(refusal)
    assert capped.refusal(spec(), ALICE, None) is None  # a job resumed from disk: caps do not apply


def test_flags_add_to_node_toml_and_bad_ones_name_the_flag(tmp_path: Path) -> None:
    (tmp_path / "node.toml").write_text('[jobs]\nallow_plugins = ["a.b:*"]\nmax_jobs = 3\n[data]\nx = "/d/x"\n')
    config = with_flags(load_node_config(tmp_path), allow_plugins=["c:d"], data=["y=rel/y", "x=/d/other"],
                        accept=f"{ALICE}, {MALLORY}", max_jobs_per_publisher=1)
    assert config.allow_plugins == ("a.b:*", "c:d") and config.max_jobs == 3 and config.max_jobs_per_publisher == 1
    assert config.data_path("x") == Path("/d/other") and config.data_path("y") == Path.cwd() / "rel/y"
    assert config.accept == (ALICE, MALLORY) and parse_accept("any") == "any"
    for flags, where in (({"allow_plugins": ["os"]}, "--allow-plugin"), ({"data": ["x"]}, "--data"),
                         ({"data": ["../x=/p"]}, "--data"), ({"accept": "not an id!"}, "--accept-jobs"),
                         ({"max_jobs": 0}, "--max-jobs")):
        with pytest.raises(NodeConfigError, match=where):
            with_flags(NodeConfig(), **flags)
    (tmp_path / "node.toml").write_text("[jobs]\nmax_jobs_per_publisher = -1\n")
    with pytest.raises(NodeConfigError, match=r"jobs\.max_jobs_per_publisher"):
        load_node_config(tmp_path)


async def test_a_refusal_is_remembered_reported_once_and_a_cap_expires(autojump_clock: trio.testing.MockClock) -> None:
    events = EventLog()
    admission = Admission(policy(max_jobs_per_publisher=1), events)
    assert admission.judge("job-a", spec(model="os:abort"), MALLORY, {}) is not None
    assert admission.judge("job-a", spec(model="os:abort"), MALLORY, {}) is not None
    assert [e["type"] for e in events.history()] == ["job_refused"]  # one line, one event
    assert "os:abort" in events.history()[0]["message"] and events.history()[0]["reason"] == "plugin"
    assert admission.refused("job-a") is not None
    await trio.sleep(CAP_RETRY_S * 10)
    assert admission.refused("job-a") is not None  # a plug-in refusal does not expire

    assert admission.judge("job-b", spec(), ALICE, {ALICE: 1}) is not None  # the cap
    assert admission.refused("job-b") is not None
    await trio.sleep(CAP_RETRY_S)
    assert admission.refused("job-b") is None  # judged again when a peer offers it next
    assert admission.judge("job-b", spec(), ALICE, {}) is None


async def test_the_memory_of_refusals_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    admission = Admission(policy(), EventLog(history=10))
    for i in range(REFUSED_MEMORY + 10):
        admission.judge(f"job-{i}", spec(model="os:abort"), MALLORY, {})
    assert admission.refused("job-0") is None and admission.refused(f"job-{REFUSED_MEMORY + 9}") is not None


async def test_a_hostile_refusal_penalises_the_publisher_once_an_ordinary_one_not_at_all(
        autojump_clock: trio.testing.MockClock) -> None:
    scored: list[tuple[str, float]] = []

    def penalise(peer: str, points: float) -> float:
        scored.append((peer, points))
        return sum(p for who, p in scored if who == peer)

    events = EventLog()
    admission = Admission(policy(accept=f"{ALICE},{MALLORY}"), events, penalise=penalise)
    admission.judge("job-a", spec(model="os:abort"), MALLORY, {})
    admission.judge("job-a", spec(model="os:abort"), MALLORY, {})  # the same frame relayed again
    admission.refuse_invalid("job-b", MALLORY, "data_path: a job never names a path")
    assert scored == [(MALLORY, 1.0), (MALLORY, 1.0)]
    assert events.history()[-1]["message"].endswith("penalty now 2.0")
    admission.judge("job-c", spec(model="cifar10-cnn", data="cifar10"), ALICE, {})  # no cifar10 here
    admission.judge("job-d", spec(), Identity.generate().peer_id, {})  # a publisher not accepted
    admission.judge("job-e", spec(model="os:abort"), ALICE, None)  # read from this node's disk at start
    admission.judge("job-f", spec(model="os:abort"), ME, {})  # this node's own
    assert scored == [(MALLORY, 1.0), (MALLORY, 1.0)]
    assert len(events.history()) == 6 and "penalty" not in events.history()[-1]["message"]
