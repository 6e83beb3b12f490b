"""The portal's Serving page and playground, served for real (Hypercorn on 127.0.0.1) over the
fake control API: per-node serving figures, live updates, and a prompt sent through the node,
with the same-origin guard every portal POST has."""

from __future__ import annotations

import httpx
from markupsafe import escape

from tests.tui.fake_serving import FAILED_WHY, RUN_ID, serve_block
from tests.tui.fake_source import SELF, peer_id
from tests.web.conftest import Served, next_update


def row_of(html: str, peer: str) -> str:
    start = html.index(f'<tr data-peer="{peer}">')
    return html[start: html.index("</tr>", start)]


async def test_the_serving_page_shows_every_server_with_its_figures(served: Served) -> None:
    served.api.serve = serve_block()
    html = (await served.client.get("/serving")).text
    busy = row_of(html, peer_id(1))
    for cell in ("bard, tiny", "7 / 8", "2.25", "143.5", "63.0 ms", "1210 ms", "12.5 ms"):
        assert f">{cell}<" in busy, (cell, busy)
    me = row_of(html, SELF)
    assert "(this node)" in me and ">local<" in me and "41.0 ms" in me and "820 ms" in me
    assert ">—<" in row_of(html, peer_id(2))  # an idle server has no medians yet
    assert "http://127.0.0.1:8000/v1" in html and RUN_ID in html and "12 / 24" in html
    assert str(escape(FAILED_WHY)) in html and FAILED_WHY not in html  # the node's words, escaped
    assert 'href="/serving" aria-current="page"' in html


async def test_the_serving_page_follows_the_node_live(served: Served) -> None:
    served.api.serve = serve_block()
    async with served.client.stream("GET", "/live/serving") as resp:
        lines = resp.aiter_lines()
        first = await next_update(lines)
        assert "7 / 8" in first["regions"]["serving"]
        served.api.serve["servers"][1]["load"] = 2
        served.api.event_log.append({"seq": 999, "ts": 0, "type": "peer_up", "message": "poke"})
        served.api._new_event.set()
        for _ in range(20):
            update = await next_update(lines)
            if "2 / 8" in update["regions"]["serving"]:
                break
        else:
            raise AssertionError("the new load never came")


async def test_a_node_that_serves_nothing_says_how_to_start(served: Served) -> None:
    html = (await served.client.get("/serving")).text
    assert "gpuflex serve" in html and "<tr data-peer" not in html
    page = (await served.client.get("/playground")).text
    assert "No node of the mesh serves a model yet" in page and "<textarea" not in page


async def test_the_playground_sends_a_prompt_through_the_node_and_shows_the_answer(served: Served) -> None:
    served.api.serve = serve_block()
    form = (await served.client.get("/playground")).text
    assert '<option value="bard">' in form and '<option value="tiny">' in form
    resp = await served.client.post("/playground", data={"model": "tiny", "prompt": "<b>ROMEO</b>:",
                                                         "max_tokens": "12", "temperature": "0.5"})
    assert resp.status_code == 200, resp.text
    assert served.api.asked == [{"model": "tiny", "prompt": "<b>ROMEO</b>:", "max_tokens": 12, "temperature": 0.5}]
    html = resp.text
    assert "&lt;b&gt;ROMEO&lt;/b&gt;:<mark> &lt;i&gt;tiny&lt;/i&gt; says 13 characters</mark>" in html
    assert "12 tokens, stopped by length" in html and "41.5 ms" in html and "230 ms" in html
    assert '<option value="tiny" selected>' in html  # the form keeps what was asked


async def test_the_playground_refuses_bad_forms_and_reports_the_nodes_refusal(served: Served) -> None:
    served.api.serve = serve_block()
    cases = [({"model": "bard", "prompt": "x" * 8193}, 400, "the playground takes 8192"),
             ({"model": "bard", "prompt": "hi", "max_tokens": "100000"}, 400, "max tokens must be from 1 to 512"),
             ({"model": "bard", "prompt": "hi", "temperature": "nan"}, 400, "temperature must be from 0 to 2"),
             ({"model": "bard", "prompt": "hi", "max_tokens": "many"}, 400, "must be numbers"),
             ({"model": "", "prompt": "hi"}, 400, "choose a model"),
             ({"model": "bard", "prompt": "   "}, 400, "write a prompt")]
    for form, status, words in cases:
        resp = await served.client.post("/playground", data=form)
        assert resp.status_code == status and words in resp.text, (form, resp.status_code)
    assert served.api.asked == []  # none of them reached the node
    resp = await served.client.post("/playground", content=b"prompt=" + b"x" * (70 * 1024) + b"&model=bard",
                                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert resp.status_code == 400 and "over 64 KiB" in resp.text
    resp = await served.client.post("/playground", data={"model": "gone", "prompt": "hi"})
    assert resp.status_code == 502 and "no node serves model &#39;gone&#39;" in resp.text
    served.api.down = True
    resp = await served.client.post("/playground", data={"model": "bard", "prompt": "hi"})
    assert resp.status_code == 503 and "the node did not answer" in resp.text


async def test_a_playground_post_from_another_site_never_reaches_the_node(served: Served) -> None:
    served.api.serve = serve_block()
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as bare:
        form = {"model": "bard", "prompt": "spend the node's compute"}
        for headers in ({}, {"origin": "null"}, {"origin": "http://evil.example"},
                        {"referer": "http://evil.example/x"}, {"sec-fetch-site": "cross-site"}):
            resp = await bare.post("/playground", data=form, headers=headers)
            assert resp.status_code == 403, (headers, resp.status_code)
        assert "serve_complete" not in served.api.calls
        ok = await bare.post("/playground", data=form, headers={"sec-fetch-site": "same-origin"})
        assert ok.status_code == 200 and served.api.calls.count("serve_complete") == 1
        # What Chromium sends for a form posted from the portal's own page under its no-referrer
        # policy: Origin "null", and the fetch metadata that says same-origin.
        ok = await bare.post("/playground", data=form, headers={"origin": "null", "sec-fetch-site": "same-origin"})
        assert ok.status_code == 200 and served.api.calls.count("serve_complete") == 2
        for site in ("cross-site", "same-site"):  # a sandboxed frame elsewhere also says "null"
            resp = await bare.post("/playground", data=form, headers={"origin": "null", "sec-fetch-site": site})
            assert resp.status_code == 403
        resp = await bare.post("/playground", data=form, headers={"origin": "http://evil.example",
                                                                  "sec-fetch-site": "same-origin"})
        assert resp.status_code == 403  # no browser sends both; refused all the same
        assert served.api.calls.count("serve_complete") == 2


async def test_prompts_beyond_the_portals_limit_in_flight_are_refused_not_queued(served: Served) -> None:
    import trio

    from gpuflex_web.serving import MAX_ASKING

    served.api.serve = serve_block()
    release = trio.Event()
    original = served.api.complete

    async def slow_call(method: str, params: dict | None = None, timeout: float | None = None) -> object:
        if method == "serve_complete":
            await release.wait()  # the node is still answering
            return original(params or {})
        return await FakeCall(method, params, timeout)

    FakeCall = served.api.call
    served.api.call = slow_call  # type: ignore[method-assign]
    codes: list[int] = []

    async def ask() -> None:
        codes.append((await served.client.post("/playground", data={"model": "bard", "prompt": "hi"})).status_code)

    async with trio.open_nursery() as nursery:
        for _ in range(MAX_ASKING):
            nursery.start_soon(ask)
        with trio.fail_after(10):
            while served.portal._asking < MAX_ASKING:
                await trio.sleep(0.01)
        refused = await served.client.post("/playground", data={"model": "bard", "prompt": "one too many"})
        assert refused.status_code == 429 and "send it again shortly" in refused.text
        release.set()
    assert codes == [200] * MAX_ASKING


async def test_a_batch_inference_job_is_listed_with_the_jobs_and_its_page_offers_its_answers(served: Served) -> None:
    served.api.serve = serve_block()
    run = dict(serve_block()["runs"][0])  # as the node's ``jobs`` lists it (BatchRun.job_row)
    run.update(job_id=RUN_ID, round=12, rounds=24, phase="infer", role="collector", coordinator="",
               members=[peer_id(1)], metrics=[], servers={peer_id(1): 12})
    served.api.job_list.append(run)
    assert RUN_ID in (await served.client.get("/jobs")).text
    page = (await served.client.get(f"/jobs/{RUN_ID}")).text
    assert f"gpuflex job results {RUN_ID} --out answers.jsonl" in page and "<dt>Answers</dt>" in page
    assert "Audit the ledger" not in page and "ledger.msgpack" not in page  # it has no ledger of rounds
    training = (await served.client.get(f"/jobs/{served.api.job_list[0]['job_id']}")).text
    assert "Audit the ledger" in training and "<dt>Round</dt>" in training


def served_row(html: str, peer: str) -> str:
    start = html.index(f'<tr data-served="{peer}">')
    return html[start: html.index("</tr>", start)]


async def test_the_contributions_page_shows_the_tokens_each_peer_served_beside_training_credit(
        served: Served) -> None:
    html = (await served.client.get("/contributions")).text
    assert "Served tokens" not in html  # a node that took in no request has no serving credit
    served.api.serve = serve_block()
    served.portal.hub._last_poll = -1e9  # the next request polls at once
    html = (await served.client.get("/contributions")).text
    assert "share of samples processed" in html  # the training credit is still there, above
    mine, theirs, liar = served_row(html, SELF), served_row(html, peer_id(1)), served_row(html, peer_id(2))
    assert "(this node)" in mine and ">1200<" in mine and ">60.0%<" in mine
    assert ">800<" in theirs and ">40.0%<" in theirs and ">1<" in theirs and "(this node)" not in theirs
    assert ">0<" in liar and '<span class="verdict bad">1</span>' in liar  # penalised by a redundancy check
    assert html.index('data-served="' + SELF) < html.index('data-served="' + peer_id(1))  # most tokens first
    serving = (await served.client.get("/serving")).text
    assert "cuda:0 bfloat16, batch 8 of 16, KV 512 MiB" in serving  # how the model is fitted to the device
    assert "Redundancy check: servers 00000002 and 00000001 disagree" in serving
