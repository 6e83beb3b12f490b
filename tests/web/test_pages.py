"""The portal's pages, served for real over a fake control API (tests/web/fake_api.py)."""

from __future__ import annotations

import csv
import io
import re

import httpx
import trio
from markupsafe import escape

from gpuflex_web.security import CSP
from tests.tui.fake_source import JOB_ID as HOSTILE_JOB
from tests.tui.fake_source import SELF, peer_id
from tests.unit.node.chain import JOB
from tests.web.conftest import Served, next_update
from tests.web.fake_api import HOSTILE_NAME

PAGES = ["/", "/peers", "/jobs", f"/jobs/{JOB}", f"/jobs/{HOSTILE_JOB}", "/contributions", "/join"]


async def job_page_with_spec(served: Served, job: str) -> str:
    """The job page once its spec is in: it arrives in the background."""
    with trio.fail_after(10):
        while "Fetching the spec" in (html := (await served.client.get(f"/jobs/{job}")).text):
            await trio.sleep(0.05)
    return html


def peer_order(html: str) -> list[str]:
    return re.findall(r'<tr data-search="[^"]*" data-peer="([^"]+)"', html)


def visible_peers(html: str) -> list[str]:
    return re.findall(r'<tr data-search="[^"]*" data-peer="([^"]+)">', html)


async def test_overview_shows_node_mesh_jobs_and_events(served: Served) -> None:
    html = (await served.client.get("/")).text
    assert SELF in html
    assert 'id="mesh-size">6<' in html  # this node and 5 peers
    assert "4 up" in html and "1 suspect" in html and "0 down" in html
    assert f'id="job-{JOB}-round" data-job="{JOB}">3<' in html and "of 5" in html
    assert "Test accuracy" in html and "<svg" in html  # the accuracy chart
    assert "round 5 committed: loss 0.36, accuracy 0.91" in html  # the event log
    assert "GTX 1070" in html


async def test_every_response_sets_the_policy_and_pages_carry_no_inline_code(served: Served) -> None:
    for path in [*PAGES, "/contributions.csv", "/static/app.js", "/static/style.css", "/nope",
                 f"/jobs/{JOB}/files/ledger.msgpack", "/live/nope"]:
        resp = await served.client.get(path)
        assert resp.headers["content-security-policy"] == CSP, path
        assert resp.headers["x-content-type-options"] == "nosniff", path
        if resp.headers["content-type"].startswith("text/html"):
            assert re.findall(r"<script(?![^>]*\bsrc=)", resp.text) == [], path
            assert not re.search(r"\son[a-z]+=", resp.text), path  # no inline event handlers
            assert " style=" not in resp.text, path  # inline styles would break the policy
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP


async def test_untrusted_strings_are_escaped(served: Served) -> None:
    served.api.peer_list[0]["info"]["accelerators"][0]["name"] = "<img src=x onerror=alert(1)>"
    for path in PAGES:
        html = (await served.client.get(path)).text
        assert "<script>alert" not in html and "<img src=x" not in html, path
    overview = (await served.client.get("/")).text
    assert str(escape(HOSTILE_NAME)) in overview
    assert str(escape(HOSTILE_NAME)) == "&lt;script&gt;alert(1)&lt;/script&gt; [/evil] $\\x$"
    peers = (await served.client.get("/peers")).text
    assert "&lt;img src=x onerror=alert(1)&gt;" in peers
    spec = await job_page_with_spec(served, JOB)  # the spec's "note" carries the name
    assert "&lt;script&gt;alert(1)" in spec or "\\u003cscript\\u003e" in spec


async def test_peers_sort_by_any_column_and_filter_by_text(served: Served) -> None:
    html = (await served.client.get("/peers?sort=rtt&dir=desc")).text
    assert peer_order(html) == [peer_id(n) for n in (4, 5, 3, 2, 1)]  # RTT 38, 12.3, 2.1, 1.4, 0.8
    assert re.search(r'aria-sort="descending"><a href="/peers\?sort=rtt&amp;dir=asc"', html)
    html = (await served.client.get("/peers?sort=memory&dir=asc")).text
    assert peer_order(html)[-1] == peer_id(3)  # 32 GiB of RAM on the CPU-only peer
    html = (await served.client.get("/peers?q=3090")).text
    assert visible_peers(html) == [peer_id(2)] and "1</span> of 5 peers shown" in html
    html = (await served.client.get("/peers?q=LEGACY")).text  # case-insensitive
    assert set(visible_peers(html)) == {peer_id(1), peer_id(5)}  # GTX 1080 and K80
    html = (await served.client.get("/peers?sort=nonsense")).text
    assert peer_order(html)[-1] == peer_id(4)  # unknown sort keys fall back to state


async def test_fields_a_node_does_not_send_read_unknown_and_shown_when_present(served: Served) -> None:
    rows = served.api.peer_list
    del rows[0]["info"]["legacy"]
    del rows[0]["reachability"]  # a node from before reachability was reported
    rows[1]["info"] = None
    rows[2]["reachability"] = "relayed"
    del rows[3]["reachability"]
    rows[3]["info"]["reachability"] = "private"  # only in the NodeInfo
    html = (await served.client.get("/peers?sort=peer")).text
    cells = {p: row for p, row in re.findall(r'data-peer="([^"]+)"[^>]*>(.*?)</tr>', html, re.S)}
    assert 'Legacy GPU">unknown<' in cells[peer_id(1)] and 'Reachability">unknown<' in cells[peer_id(1)]
    assert 'Device">—<' in cells[peer_id(2)] and 'Memory">—<' in cells[peer_id(2)]
    assert 'Reachability">relayed<' in cells[peer_id(3)]
    assert 'Reachability">private<' in cells[peer_id(4)]
    assert 'Legacy GPU">yes<' in cells[peer_id(5)]


async def test_job_page_shows_spec_members_ledger_and_downloads(served: Served) -> None:
    first = (await served.client.get(f"/jobs/{JOB}")).text
    assert "Fetching the spec from the node" in first  # the page does not wait for the files
    html = await job_page_with_spec(served, JOB)
    assert "digits-cnn" in html  # the spec, from the node's job_status
    assert "job_status" in served.api.calls and "job_results" not in served.api.calls  # no export for it
    ledger = served.api.ledger_rows(JOB)
    for row in ledger:
        assert row["result_hash"][:12] in html
        assert row["coordinator"][-8:] in html
    assert html.count('<li><code title="') >= 9  # 3 rounds × 3 contributors
    for name in ("ledger.msgpack", "model.pt", "model.blob"):
        assert f'href="/jobs/{JOB}/files/{name}"' in html
    resp = await served.client.get(f"/jobs/{JOB}/files/ledger.msgpack")
    assert resp.status_code == 200
    assert resp.headers["content-disposition"] == f'attachment; filename="{JOB}-ledger.msgpack"'
    assert resp.content == (served.portal.exporter.root / JOB / "round-3" / "ledger.msgpack").read_bytes()
    assert (await served.client.get(f"/jobs/{JOB}/files/..%2Fetc%2Fpasswd")).status_code == 404
    assert (await served.client.get("/jobs/nosuchjob")).status_code == 404


async def test_audit_button_runs_the_ledger_verification(served: Served) -> None:
    json_accept = {"accept": "application/json"}
    verdict = (await served.client.post(f"/jobs/{JOB}/audit", headers=json_accept)).json()
    assert verdict["ok"] and verdict["rounds"] == 3
    assert verdict["text"].startswith("Chain verified: 3 rounds")
    assert "the model matches round 3" in verdict["text"]
    bad = (await served.client.post(f"/jobs/{HOSTILE_JOB}/audit", headers=json_accept)).json()
    assert not bad["ok"] and "Audit failed: ledger: file cannot be read" in bad["text"]
    # Without the script, the form posts and the page comes back with the verdict in it.
    page = await served.client.post(f"/jobs/{JOB}/audit")
    assert page.status_code == 200 and 'class="verdict ok"' in page.text
    served.api.commit_round()
    served.portal.hub._last_poll = -1e9  # the next request polls at once
    verdict = (await served.client.post(f"/jobs/{JOB}/audit", headers=json_accept)).json()
    assert verdict["ok"] and verdict["rounds"] == 4  # a new round, a new export


async def test_contributions_page_and_csv_count_every_ledger(served: Served) -> None:
    html = (await served.client.get("/contributions")).text
    assert "share of samples processed" in html
    resp = await served.client.get("/contributions.csv")
    assert resp.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    expected: dict[str, list[int]] = {}
    for job in (JOB, HOSTILE_JOB):
        for r in served.api.ledger_rows(job):
            for c in r["contributors"]:
                cell = expected.setdefault(c["peer"], [0, 0])
                cell[0] += 1
                cell[1] += c["samples"]
    assert {r["peer"]: [int(r["rounds"]), int(r["samples"])] for r in rows} == expected
    total = sum(v[1] for v in expected.values())
    for r in rows:
        assert abs(float(r["compute_share"]) - int(r["samples"]) / total) < 1e-6
        assert r["share_basis"] == "samples" and r["compute_seconds"] == ""
    assert "Per job" in html  # two jobs hold ledgers


async def test_join_page_gives_the_address_the_commands_and_a_qr_code(served: Served) -> None:
    html = (await served.client.get("/join")).text
    best = "/ip4/192.0.2.7/tcp/4001/p2p/" + SELF  # a routable address before loopback
    assert f"gpuflex node start --bootstrap {best}" in html
    assert "just setup" in html and "pip install gpuflex" not in html  # the README's install
    assert re.search(r'<svg viewBox="0 0 \d+ \d+" class="qr">', html)
    assert "loopback only" not in html


async def test_live_stream_pushes_each_new_snapshot_and_the_disconnect(served: Served) -> None:
    async with served.client.stream("GET", "/live/overview") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.aiter_lines()
        first = await next_update(lines)
        assert f'data-job="{JOB}">3<' in first["regions"]["jobs"]
        assert set(first["regions"]) == {"banner", "clock", "status", "jobs", "events"}
        served.api.commit_round()
        with trio.fail_after(10):  # the next poll (a second at most) pushes it
            update = await next_update(lines)
            while f'data-job="{JOB}">4<' not in update["regions"]["jobs"]:
                update = await next_update(lines)
        served.api.down = True
        with trio.fail_after(10):
            update = await next_update(lines)
        assert update["connected"] is False
        assert "Disconnected, retrying." in update["regions"]["banner"]
        assert f'data-job="{JOB}">4<' in update["regions"]["jobs"]  # the last data stays
        served.api.down = False
        with trio.fail_after(10):
            while not (update := await next_update(lines))["connected"]:
                pass
        assert update["regions"]["banner"].strip() == ""


async def test_polls_are_at_least_a_second_apart_however_many_watch(served: Served) -> None:
    async def watch() -> None:
        async with served.client.stream("GET", "/live/peers") as resp:
            lines = resp.aiter_lines()
            for _ in range(2):
                await next_update(lines)

    served.api.calls.clear()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(watch)
        for _ in range(5):
            await served.client.get("/")
    elapsed = trio.current_time() - start
    polls = served.api.calls.count("status")
    assert 1 <= polls <= elapsed + 1, (polls, elapsed)
    with trio.fail_after(5):  # closed streams stop counting as watchers
        while served.portal.hub._watchers:
            await trio.sleep(0.05)


async def test_a_page_served_while_the_node_is_down_says_so(served: Served) -> None:
    served.api.down = True
    html = (await served.client.get("/")).text
    assert "Disconnected, retrying." in html and "connection refused" in html


async def test_cross_site_posts_are_refused(served: Served) -> None:
    resp = await served.client.post(f"/jobs/{JOB}/audit", headers={"origin": "http://evil.example"})
    assert resp.status_code == 403
    # a page elsewhere that rebinds its name to 127.0.0.1 is not answered
    resp = await served.client.get("/", headers={"host": "evil.example"})
    assert resp.status_code == 421


async def test_off_loopback_the_portal_asks_for_the_login_token(nursery: trio.Nursery, tmp_path) -> None:
    from tests.web.conftest import start

    token = "ab" * 32
    s = await start(nursery, tmp_path, token=token)
    async with s.client as client:
        resp = await client.get("/peers?sort=rtt")
        assert resp.status_code == 303 and resp.headers["location"] == "/login?next=%2Fpeers%3Fsort%3Drtt"
        assert (await client.get("/contributions.csv", headers={"accept": "text/csv"})).status_code == 401
        assert (await client.get("/static/style.css")).status_code == 200
        login = (await client.get("/login")).text
        assert "web.token" in login and token not in login
        wrong = await client.post("/login", data={"token": "cd" * 32, "next": "/peers"})
        assert wrong.status_code == 401 and not client.cookies
        right = await client.post("/login", data={"token": token, "next": "https://evil.example/"})
        assert right.status_code == 303 and right.headers["location"] == "/"
        assert "httponly" in right.headers["set-cookie"].lower()
        assert "samesite=strict" in right.headers["set-cookie"].lower()
        assert token not in right.headers["set-cookie"]
        assert (await client.get("/peers")).status_code == 200
    async with httpx.AsyncClient(base_url=s.url) as script:
        bearer = {"authorization": f"Bearer {token}"}
        assert (await script.get("/contributions.csv", headers=bearer)).status_code == 200
