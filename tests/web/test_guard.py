"""The portal's request guard: same-origin proof for changes, no work for another site's
requests, and throttled log-in attempts. The portal is served by Hypercorn on loopback; the node
behind it is the test double of its control API (this tests the guard layer alone)."""

from __future__ import annotations

import httpx
import trio

from gpuflex_web.security import LOGIN_BURST, LoginThrottle
from tests.unit.node.chain import JOB
from tests.web.conftest import Served, start


async def test_a_post_without_same_origin_proof_is_refused(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as bare:
        resp = await bare.post(f"/jobs/{JOB}/audit")  # no Origin, no Referer, no fetch metadata
        assert resp.status_code == 403 and "same-origin" in resp.text
        assert (await bare.post(f"/jobs/{JOB}/audit", headers={"origin": "null"})).status_code == 403
        assert (await bare.post(f"/jobs/{JOB}/audit", headers={"referer": "http://evil.example/x"})).status_code == 403
        assert "job_results" not in served.api.calls  # nothing was audited
        # The portal's own page, as a browser that sends fetch metadata or a Referer shows it.
        ok = await bare.post(f"/jobs/{JOB}/audit", headers={"sec-fetch-site": "same-origin",
                                                             "accept": "application/json"})
        assert ok.status_code == 200
        ok = await bare.post(f"/jobs/{JOB}/audit", headers={"referer": f"{served.url}/jobs/{JOB}",
                                                             "accept": "application/json"})
        assert ok.status_code == 200


async def test_a_cross_site_get_of_a_download_does_no_work(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as browser:
        for headers in ({"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors", "sec-fetch-dest": "image"},
                        {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate", "sec-fetch-dest": "document"},
                        {"sec-fetch-site": "same-site", "sec-fetch-mode": "navigate"},
                        {"referer": "http://evil.example/page"}):
            for path in (f"/jobs/{JOB}/files/model.pt", f"/jobs/{JOB}"):
                resp = await browser.get(path, headers=headers)
                assert resp.status_code == 403, (path, headers, resp.status_code)
        assert "job_results" not in served.api.calls, "a request from another site made the node export"
        # A link from elsewhere to the overview opens it; the portal's own links work as ever.
        link = await browser.get("/", headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"})
        assert link.status_code == 200
        own = await browser.get(f"/jobs/{JOB}/files/ledger.msgpack", headers={"sec-fetch-site": "same-origin"})
        assert own.status_code == 200 and "job_results" in served.api.calls


async def test_log_in_attempts_are_throttled(nursery: trio.Nursery, tmp_path) -> None:
    token = "ab" * 32
    s = await start(nursery, tmp_path, token=token)
    async with s.client as client:
        codes = []
        for _ in range(LOGIN_BURST + 10):
            resp = await client.post("/login", data={"token": "cd" * 32, "next": "/"})
            codes.append(resp.status_code)
        print("status codes of wrong log-in attempts:", codes)
        assert codes.count(401) <= LOGIN_BURST + 3, codes  # the burst, and what refilled meanwhile
        refused = [c for c in codes if c == 429]
        assert len(refused) >= 5, codes
        resp = await client.post("/login", data={"token": "cd" * 32})
        assert resp.status_code == 429 and int(resp.headers["retry-after"]) >= 1
    async with httpx.AsyncClient(base_url=s.url) as script:  # wrong bearer tokens count as well
        codes = [(await script.get("/peers", headers={"authorization": "Bearer x"})).status_code for _ in range(10)]
        assert 429 in codes, codes


def test_the_throttle_refills_per_address_and_caps_all_together() -> None:
    now = [0.0]
    throttle = LoginThrottle(clock=lambda: now[0])
    assert all(throttle.wait_s("a") == 0 for _ in range(LOGIN_BURST))
    assert throttle.wait_s("a") > 0  # a's burst is spent ...
    assert throttle.wait_s("b") == 0  # ... not b's
    now[0] += 60
    assert throttle.wait_s("a") == 0
    spent = sum(throttle.wait_s(f"10.0.0.{i}") == 0 for i in range(100))
    assert spent < 30  # many addresses share the total budget
