"""The portal's Serving page and its playground.

Serving lists every node of the mesh that serves a model (its load, requests and tokens per
second, time to first token and latency), the models this node serves and its batch
inference jobs, from the ``serve`` block of the node's status (gpuflex.serve.view). The
playground sends one prompt through the node's router (control method ``serve_complete``, the
same path an API request takes) and shows the answer, who made it and how fast.

The playground's form is a POST, so the portal's guard asks it for same-origin proof like every
other change (gpuflex_web.security); the prompt is bounded here before the node bounds it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from gpuflex_web.hub import Snapshot

Params = Mapping[str, str]
#: A playground form's body: a prompt of PROMPT_CHARS, percent-encoded, fits with room.
MAX_BODY = 64 * 1024
PROMPT_CHARS = 8192
MAX_TOKENS = 512
DEADLINE_S = 130.0  # the node's own is 120 s
#: Playground prompts the portal has in flight at once; more are refused, not queued.
MAX_ASKING = 4


class BadForm(ValueError):
    """The playground's form is out of bounds; the message says which field."""


class Busy(BadForm):
    """The portal has MAX_ASKING prompts in flight already."""


@dataclass(frozen=True)
class Ask:
    """One playground request, bounded."""

    model: str
    prompt: str
    max_tokens: int
    temperature: float

    def params(self) -> dict[str, Any]:
        return {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens,
                "temperature": self.temperature}


def model_names(snap: Snapshot) -> list[str]:
    """Every model some server of the mesh announces, sorted."""
    return sorted({m for s in snap.serving.servers for m in s.models} | {m.name for m in snap.serving.models})


def serving_view(snap: Snapshot, params: Params) -> dict[str, Any]:
    return {"serving": snap.serving, "models": model_names(snap)}


def parse_form(body: bytes) -> Ask:
    if len(body) > MAX_BODY:
        raise BadForm(f"the form is over {MAX_BODY // 1024} KiB")
    form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
    model, prompt = form.get("model", "").strip(), form.get("prompt", "")
    if not model or len(model) > 64:
        raise BadForm("choose a model")
    if not prompt.strip():
        raise BadForm("write a prompt")
    if len(prompt) > PROMPT_CHARS:
        raise BadForm(f"the prompt has {len(prompt)} characters; the playground takes {PROMPT_CHARS}")
    try:
        max_tokens = int(form.get("max_tokens", "64"))
        temperature = float(form.get("temperature", "0"))
    except ValueError:
        raise BadForm("max tokens and temperature must be numbers") from None
    if not 1 <= max_tokens <= MAX_TOKENS:
        raise BadForm(f"max tokens must be from 1 to {MAX_TOKENS}")
    if not 0.0 <= temperature <= 2.0:  # NaN fails too
        raise BadForm("temperature must be from 0 to 2")
    return Ask(model, prompt, max_tokens, temperature)
