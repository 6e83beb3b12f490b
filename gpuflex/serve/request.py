"""One generation request, as the HTTP API and the mesh both carry it, bounded on the way in.

The same checks run on a request from a local HTTP client and on one a peer routes here: a
peer's request is no more trusted than a stranger's HTTP call.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from gpuflex.serve import BadRequest
from gpuflex.serve.settings import NAME_RE

#: A prompt's characters before tokenising (the token limit is the node's own, checked after).
MAX_PROMPT_CHARS = 256 * 1024
MAX_STOPS, MAX_STOP_CHARS = 4, 64
MAX_TOKENS_CAP = 1 << 16


@dataclass(frozen=True)
class GenRequest:
    model: str
    prompt: str
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False  # the chosen tokens' log-probabilities (redundancy checks use them)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_wire(self) -> dict[str, Any]:
        body = asdict(self)
        body["stop"] = list(self.stop)
        return body


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or not low <= value <= high:
        raise BadRequest(f"'{key}' must be a number from {low:g} to {high:g}")
    return float(value)


def parse_request(body: Any, *, default_max_tokens: int = 16) -> GenRequest:
    """A GenRequest from a decoded JSON or msgpack object; BadRequest names the field."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not NAME_RE.match(model):
        raise BadRequest("'model' must name a served model (see /v1/models)")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # the OpenAI API allows a list; one prompt per request here
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadRequest(f"the prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS_CAP:
        raise BadRequest(f"'max_tokens' must be an integer from 1 to {MAX_TOKENS_CAP}")
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOPS or not all(
            isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop):
        raise BadRequest(f"'stop' must be a string or at most {MAX_STOPS} strings of 1 to {MAX_STOP_CHARS} characters")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
        raise BadRequest("'seed' must be a non-negative integer")
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, (bool, int)):
        raise BadRequest("'logprobs' must be a boolean or an integer")
    return GenRequest(model=model, prompt=prompt, max_tokens=max_tokens,
                      temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                      top_p=_number(body, "top_p", 1.0, 0.0, 1.0), stop=tuple(stop), seed=seed,
                      logprobs=bool(logprobs))
