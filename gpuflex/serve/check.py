"""``redundancy = 2``: a share of the requests this node takes in is run again on a second
server of the same model (same hash), and the two answers are compared.

- Greedy requests (temperature 0): the token ids must be equal, exactly.
- Sampled requests are given a seed if they had none, so both servers draw the same random
  numbers; the log-probabilities of the chosen tokens must agree within ``TOLERANCE`` nats
  along the tokens both chose alike. Where the sampled tokens part, float differences between
  two honest machines can be the cause, so the comparison stops there with no verdict, unless
  the two disagreed by more than the tolerance before it.

A mismatch alone cannot tell who is wrong, so a third server, when there is one, is asked the
same; whoever disagrees with it is penalised (one fault, as bad input on the wire). With only
two servers the mismatch is recorded against both and nobody is penalised.

What it catches: a server that returns another model's tokens, a cheaper (quantised, pruned,
truncated) model's, or made-up text, on the checked share of requests. What it does not: a
server that answers checked requests honestly and others not (it cannot tell which requests are
checked, so it is caught at the checked rate); two colluding servers that lie alike; a lie on
a request that is not checked; slightly wrong sampled tokens after the first divergence.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import AsyncGenerator, Callable
from typing import Any

from gpuflex.serve import ServeError
from gpuflex.serve.request import GenRequest

log = logging.getLogger("gpuflex.serve")
#: Log-probabilities of the same token on two honest CPUs differ by far less than this.
TOLERANCE = 0.01

Answer = list[tuple[int, float]]
#: The verdicts ``gpuflex status`` keeps (newest last), each one line.
REPORTS = 16


def compare(a: Answer, b: Answer, greedy: bool) -> str | None:
    """None when the answers agree, else why not."""
    if greedy:
        ta, tb = [t for t, _ in a], [t for t, _ in b]
        if ta != tb:
            first = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
            return f"greedy tokens differ from position {first}"
        return None
    for i, ((t1, l1), (t2, l2)) in enumerate(zip(a, b, strict=False)):
        if abs(l1 - l2) > TOLERANCE:
            return f"log-probability of token {i} differs by {abs(l1 - l2):.3g} nats"
        if t1 != t2:
            return None  # the samples parted: no verdict past here
    return None if len(a) == len(b) else "the answers have different lengths"


async def collect(items: AsyncGenerator[dict[str, Any], None]) -> Answer:
    answer: Answer = []
    async for item in items:
        if "token" in item and isinstance(item.get("logprob"), float):
            answer.append((int(item["token"]), float(item["logprob"])))
    return answer


Generate = Callable[..., AsyncGenerator[dict[str, Any], None]]


class Checker:
    def __init__(self, generate: Generate, penalise: Callable[[str], None]) -> None:
        self.generate, self.penalise = generate, penalise
        self.checked = 0
        self.mismatches: Counter[str] = Counter()  # peer -> mismatches it was part of
        self.penalised: Counter[str] = Counter()
        self.reports: deque[str] = deque(maxlen=REPORTS)  # the latest mismatches, for status

    async def _answer(self, req: GenRequest, model_hash: str, exclude: set[str]) -> tuple[str, Answer] | None:
        chosen: list[str] = []

        async def note(peer: str) -> None:
            chosen.append(peer)

        try:
            answer = await collect(self.generate(req, model_hash=model_hash, exclude=frozenset(exclude),
                                                 on_server=note))
        except ServeError as exc:
            log.info("redundancy check could not run: %s", exc)
            return None
        return (chosen[-1], answer) if chosen else None

    async def check(self, req: GenRequest, model_hash: str, first: str, answer: Answer) -> str | None:
        """Run ``req`` on another server and compare; the verdict, None when they agree."""
        second = await self._answer(req, model_hash, {first})
        if second is None:
            return None
        self.checked += 1
        why = compare(answer, second[1], req.greedy)
        if why is None:
            return None
        peers = [first, second[0]]
        self.mismatches.update(peers)
        referee = await self._answer(req, model_hash, set(peers))
        verdict = f"servers {first[-8:]} and {second[0][-8:]} disagree on {req.model!r}: {why}"
        if referee is None:
            self.reports.append(f"{verdict}; no third server to tell which is wrong")
            log.warning("%s", self.reports[-1])
            return verdict
        for peer, theirs in ((first, answer), (second[0], second[1])):
            if compare(theirs, referee[1], req.greedy) is not None:
                self.penalised[peer] += 1
                self.penalise(peer)
                verdict += f"; {peer[-8:]} disagrees with a third server too and is penalised"
        log.warning("%s", verdict)
        self.reports.append(verdict)
        return verdict

    def row(self) -> dict[str, Any]:
        return {"checked": self.checked, "mismatches": dict(self.mismatches), "penalised": dict(self.penalised),
                "reports": list(self.reports)}
