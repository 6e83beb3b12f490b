"""The OpenAI-compatible API's own layer against bad input, on the chat endpoint too: each gets
a clear error and a status, nothing reaches the model, and the API answers the next request.
The service behind it is a stand-in (this tests the HTTP layer alone; tests/integration/
test_serving.py drives the same cases through real node processes on /v1/completions)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import trio

from gpuflex.serve import UnknownModel
from gpuflex.serve.http import MAX_BODY, MAX_IN_FLIGHT, MAX_MESSAGES, build_app
from gpuflex.serve.request import MAX_PROMPT_CHARS, MAX_TOKENS_CAP, GenRequest


class Model:
    """Serves 'tiny' only; ``hold`` keeps every answer waiting (a flood's requests pile up)."""

    home = None

    def __init__(self) -> None:
        self.asked: list[GenRequest] = []
        self.hold: trio.Event | None = None

    async def generate(self, req: GenRequest) -> AsyncGenerator[dict[str, Any], None]:
        if req.model != "tiny":
            raise UnknownModel(f"no node serves model {req.model!r}")
        self.asked.append(req)
        if self.hold is not None:
            await self.hold.wait()
        yield {"text": "ok", "n": 1}
        yield {"finish": "stop", "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def model_list(self) -> list[dict[str, Any]]:
        return [{"id": "tiny", "object": "model"}]


def client(model: Model) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(model, None)),
                             base_url="http://127.0.0.1:8000", timeout=30)


def chat(messages: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages, **extra}


async def test_bad_chat_requests_get_a_clear_error_and_never_reach_the_model() -> None:
    model = Model()
    user = {"role": "user", "content": "hi"}
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (json.dumps([user]).encode(), 400, "JSON object"),
        (json.dumps(chat("hi")).encode(), 400, "'messages' must be a list"),
        (json.dumps(chat([])).encode(), 400, "'messages' must be a list"),
        (json.dumps(chat([user] * (MAX_MESSAGES + 1))).encode(), 400, f"1 to {MAX_MESSAGES} messages"),
        (json.dumps(chat([{"role": "user"}])).encode(), 400, "string 'content'"),
        (json.dumps(chat([{"role": "user", "content": ["a", "b"]}])).encode(), 400, "string 'content'"),
        (json.dumps(chat([{"role": 7, "content": "x"}])).encode(), 400, "'role'"),
        (json.dumps(chat([{"role": "user", "content": "x" * MAX_PROMPT_CHARS}])).encode(), 400, "characters"),
        (json.dumps(chat([user], max_tokens=MAX_TOKENS_CAP + 1)).encode(), 400, "max_tokens"),
        (json.dumps(chat([user], max_tokens=-1)).encode(), 400, "max_tokens"),
        (json.dumps(chat([user], temperature=1e9)).encode(), 400, "temperature"),
        (json.dumps({**chat([user]), "model": "../../etc/passwd"}).encode(), 400, "'model'"),
        (json.dumps({**chat([user]), "model": "nope"}).encode(), 404, "no node serves model 'nope'"),
        (b'{"messages": "' + b"x" * MAX_BODY + b'"}', 413, "over"),
    ]
    async with client(model) as http:
        for body, status, words in cases:
            resp = await http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            assert resp.status_code == status, (body[:60], resp.text)
            err = resp.json()["error"]
            assert words in err["message"] and err["code"] == status, (body[:60], err)
        assert model.asked == []
        ok = await http.post("/v1/chat/completions", json=chat([user], max_tokens=3))
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "ok"
        assert model.asked[0].prompt == "user: hi\nassistant:" and model.asked[0].max_tokens == 3


async def test_a_flood_past_the_in_flight_limit_is_answered_429_at_once_and_the_rest_are_served() -> None:
    model = Model()
    model.hold = trio.Event()
    codes: list[int] = []
    async with client(model) as http:

        async def ask() -> None:
            resp = await http.post("/v1/chat/completions", json=chat([{"role": "user", "content": "flood"}]))
            codes.append(resp.status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(MAX_IN_FLIGHT):
                nursery.start_soon(ask)
            with trio.fail_after(20):
                while len(model.asked) < MAX_IN_FLIGHT:
                    await trio.sleep(0.01)
            over = await http.post("/v1/chat/completions", json=chat([{"role": "user", "content": "one more"}]))
            assert over.status_code == 429 and "in flight" in over.json()["error"]["message"]
            assert over.headers["retry-after"] == "1"  # when to ask again
            model.hold.set()
        assert codes == [200] * MAX_IN_FLIGHT
        after = await http.post("/v1/chat/completions", json=chat([{"role": "user", "content": "after"}]))
        assert after.status_code == 200
