"""Redundancy checks: greedy answers must match exactly, sampled ones by log-probability; a
third server decides whom a mismatch is penalised against. The servers here are stand-ins
(this tests the checker's rules, not the mesh)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuflex.serve import UnknownModel
from gpuflex.serve.check import TOLERANCE, Checker, compare
from gpuflex.serve.request import GenRequest

HONEST = [(5, -0.5), (7, -1.25), (9, -0.1)]


def test_greedy_answers_must_match_token_for_token() -> None:
    assert compare(HONEST, list(HONEST), greedy=True) is None
    assert "position 1" in str(compare(HONEST, [(5, -0.5), (8, -1.25), (9, -0.1)], greedy=True))


def test_sampled_answers_are_compared_by_log_probability_until_they_part() -> None:
    close = [(t, lp + TOLERANCE / 2) for t, lp in HONEST]
    assert compare(HONEST, close, greedy=False) is None
    assert "nats" in str(compare(HONEST, [(5, -0.5), (7, -3.0), (9, -0.1)], greedy=False))
    parted = [(5, -0.5), (6, -1.25), (1, -9.0)]  # same probabilities up to where the samples part
    assert compare(HONEST, parted, greedy=False) is None


def servers(answers: dict[str, list[tuple[int, float]]]) -> Any:
    async def generate(req: GenRequest, model_hash: str = "", exclude: frozenset[str] = frozenset(),
                       on_server: Any = None) -> AsyncIterator[dict[str, Any]]:
        left = [p for p in sorted(answers) if p not in exclude]
        if not left:  # as the router says when no other server is left
            raise UnknownModel("no other server")
        peer = left[0]
        await on_server(peer)
        for token, logprob in answers[peer]:
            yield {"text": "x", "n": 1, "token": token, "logprob": logprob}

    return generate


async def test_a_mismatch_is_penalised_against_the_server_a_third_one_disagrees_with() -> None:
    liar = [(5, -0.5), (6, -2.0), (6, -2.0)]
    penalised: list[str] = []
    checker = Checker(servers({"b-honest": HONEST, "c-honest": HONEST}), penalised.append)
    req = GenRequest("m", "p", 3, 0.0, logprobs=True)
    verdict = await checker.check(req, "h", "a-liar", liar)
    assert verdict is not None and "a-liar"[-8:] in verdict and penalised == ["a-liar"]
    assert checker.mismatches == {"a-liar": 1, "b-honest": 1} and checker.checked == 1
    assert await checker.check(req, "h", "a-honest", HONEST) is None
    assert checker.row()["reports"] == [verdict] and "is penalised" in verdict  # what status shows


async def test_with_two_servers_a_mismatch_is_recorded_and_nobody_is_penalised() -> None:
    penalised: list[str] = []
    checker = Checker(servers({"b": HONEST}), penalised.append)
    verdict = await checker.check(GenRequest("m", "p", 3, 0.0), "h", "a", [(1, -1.0)] * 3)
    assert verdict is not None and "no third" not in verdict and penalised == []
    assert checker.mismatches == {"a": 1, "b": 1}
    assert checker.row()["reports"] == [f"{verdict}; no third server to tell which is wrong"]


def test_a_lying_test_server_is_only_its_own_operators_choice_and_only_on_loopback() -> None:
    import torch

    from gpuflex.adversary import SERVE_ENV, negate_logits, serve_tamper

    loopback = ["/ip4/127.0.0.1/tcp/0"]
    assert serve_tamper(loopback, {}) is None  # every real node
    assert serve_tamper(loopback, {SERVE_ENV: "wrong-tokens"}) is negate_logits
    with pytest.raises(ValueError, match="only allowed on loopback"):
        serve_tamper(["/ip4/0.0.0.0/tcp/4001"], {SERVE_ENV: "wrong-tokens"})
    with pytest.raises(ValueError, match="unknown"):
        serve_tamper(loopback, {SERVE_ENV: "something"})
    logits = torch.tensor([[0.1, 3.0, -2.0]])
    assert int(torch.argmax(negate_logits(logits))) == 2  # the least likely token wins: made-up text
