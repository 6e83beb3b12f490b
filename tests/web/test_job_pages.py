"""The job page for the jobs a new user runs first: a language model (LoRA) while it trains,
and a long job of 400 rounds; and the portal after an idle spell across a node restart.
Served for real over the fake control API (tests/web/fake_api.py)."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import trio
from markupsafe import escape

from gpuflex_web.model import short
from gpuflex_web.views import LEDGER_PAGE
from tests.tui.fake_source import JOB_ID as OTHER_JOB
from tests.tui.fake_source import peer_id
from tests.unit.node.chain import JOB
from tests.web.conftest import Served, start
from tests.web.fake_api import LLM_JOB, LONG_JOB
from tests.web.test_pages import job_page_with_spec


async def test_a_language_model_job_offers_its_adapter_not_a_missing_model_pt(served: Served) -> None:
    served.api.add_llm_and_long_jobs()
    html = await job_page_with_spec(served, LLM_JOB)
    assert f'href="/jobs/{LLM_JOB}/files/adapter.zip"' in html and "files/model.pt" not in html
    files = html.split("Files and audit")[1][:800]
    assert "round 4 of 10" in files and "still running" in files and "(final)" not in files
    resp = await served.client.get(f"/jobs/{LLM_JOB}/files/adapter.zip")
    assert resp.status_code == 200
    names = set(zipfile.ZipFile(io.BytesIO(resp.content)).namelist())
    assert {"adapter/adapter_model.safetensors", "adapter/adapter_config.json", "base/config.json",
            "export.json"} <= names
    missing = await served.client.get(f"/jobs/{LLM_JOB}/files/model.pt")
    assert missing.status_code == 404 and "adapter" in missing.text  # not a 502: says what there is
    # Perplexity and what each round's updates weighed, beside loss and accuracy.
    assert "Perplexity" in html and re.search(r'data-label="Perplexity">\d+\.\d\d<', html)
    assert re.search(r'data-label="Sent">145 KiB<', html), html
    assert 'class="chart perplexity"' in html
    # The loss axis fits the data (2.5 to 2.9 here), not a zero-based band with two ticks.
    loss = html[html.index('class="chart loss"'):]
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([\d.]+)</text>', loss[:loss.index("</svg>")])]
    assert len(ticks) >= 3 and ticks[0] >= 2.0, ticks


async def test_the_job_page_names_the_members_whose_job_failed_there(served: Served) -> None:
    why = "[Errno 2] No such file or directory: '<path>'"
    served.api.job_list[0]["gone"] = [
        {"peer": peer_id(2), "reason": why},
        {"peer": peer_id(3), "reason": "<script>alert(1)</script>"},
        {"reason": "a row that names no peer"}, "junk",
    ]
    html = (await served.client.get(f"/jobs/{JOB}")).text
    gone = html.split("<h2>Gone</h2>")[1].split("</ul>")[0]
    assert gone.count("<li>") == 2
    assert f'<code title="{peer_id(2)}">{short(peer_id(2), 12)}</code>' in gone and str(escape(why)) in gone
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in gone and "<script>" not in gone
    assert "a row that names no peer" not in html
    assert "<h2>Gone</h2>" not in (await served.client.get(f"/jobs/{OTHER_JOB}")).text


async def test_a_finished_classic_job_calls_its_model_final(served: Served) -> None:
    served.api.add_llm_and_long_jobs()
    html = await job_page_with_spec(served, LONG_JOB)
    files = html.split("Files and audit")[1][:800]
    assert "files/model.pt" in files and "(final)" in files and "still running" not in files


async def test_a_400_round_job_is_paginated_with_the_spec_on_top(served: Served) -> None:
    served.api.add_llm_and_long_jobs(long_rounds=400)
    html = await job_page_with_spec(served, LONG_JOB)
    rounds = [int(r) for r in re.findall(r'<td data-label="Round">(\d+)</td>', html)]
    assert rounds == list(range(400, 400 - LEDGER_PAGE, -1))  # newest first, one page
    assert len(html) < 200_000, len(html)
    assert "page 1 of 8" in html and 'href="?page=2#ledger-h"' in html
    older = (await served.client.get(f"/jobs/{LONG_JOB}?page=8")).text
    assert [int(r) for r in re.findall(r'<td data-label="Round">(\d+)</td>', older)] == list(range(50, 0, -1))
    assert 'href="?page=7#ledger-h"' in older and "rel=\"next\"" not in older
    # The spec reads like the job file, above the files and the ledger; no Python True.
    spec_at, ledger_at = html.index('id="spec-h"'), html.index('id="ledger-h"')
    assert spec_at < html.index('id="files-h"') < ledger_at
    spec = html[spec_at:html.index("</pre>", spec_at)]
    assert "secure_aggregation = false" in spec and "True" not in spec and "False" not in spec
    assert 'model = &#34;mlp&#34;' in spec or 'model = "mlp"' in spec
    # Contributor cells in words, not field names.
    assert "samples_per_s" not in html and "1,235 samples/s" in html and "30 local steps" in html
    # The charts: many rounds as a line with no marker band, a y axis fitted to the data
    # with several round-numbered ticks.
    loss = html[html.index('class="chart loss"'):]
    loss = loss[:loss.index("</svg>")]
    assert "<circle" not in loss
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([\d.]+)</text>', loss)]
    assert len(ticks) >= 4, ticks


async def test_an_idle_portal_does_not_serve_a_picture_from_before_a_node_restart(nursery: trio.Nursery,
                                                                                  tmp_path: Path) -> None:
    clock = [1_000_000.0]
    served = await start(nursery, tmp_path)
    served.portal.hub.wall_clock = lambda: clock[0]
    async with served.client:
        assert served.api.job_list[0]["job_id"] in (await served.client.get("/jobs")).text
        clock[0] += 600  # ten idle minutes; the node is restarting now
        served.api.down = True
        await trio.sleep(1.1)  # past the poll interval
        jobs = (await served.client.get("/jobs")).text
        assert "Disconnected, retrying." in jobs
        assert served.api.job_list[0]["job_id"] not in jobs  # no ten-minute-old list
        job = await served.client.get(f"/jobs/{served.api.job_list[0]['job_id']}")
        assert job.status_code == 503 and "does not answer" in job.text and "knows no job" not in job.text
