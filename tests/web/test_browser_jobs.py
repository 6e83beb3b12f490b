"""The job pages a new user meets first, in a real browser (headless Chromium) at 375 and
1920 px: a LoRA language-model job still training and a finished job of 400 rounds, served
over the fake control API (tests/web/fake_api.py); and the Join page. Each page must fit the
width, show the spec above the ledger, page through the rounds, and say honestly which model
file it offers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.web.browser import make_driver, png_size, set_viewport, wait_for
from tests.web.conftest import start
from tests.web.fake_api import LLM_JOB, LONG_JOB

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SIZES = ((1920, 1080), (375, 812))


def fits(drv: Any, name: str, width: int) -> None:
    overflow = drv.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{name} is wider than {width} px by {overflow} px"


def top_of(drv: Any, css: str) -> float:
    return float(drv.execute_script("return document.querySelector(arguments[0]).getBoundingClientRect().top", css))


def texts(drv: Any, css: str) -> list[str]:
    """Every match's text, read in one step: a live update swaps regions whole, so an element
    found in one call may be gone in the next."""
    return list(drv.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText)", css))


def height(drv: Any, css: str) -> float:
    return float(drv.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.getBoundingClientRect().height : 0", css))


def check_pages(drv: Any, url: str, shots: Path) -> None:
    for width, h in SIZES:
        set_viewport(drv, width, h)
        # The 400-round job: one page of 50 rounds, the spec (a job file) above the ledger.
        drv.get(f"{url}/jobs/{LONG_JOB}")
        wait_for(lambda: "rounds = 400" in "".join(texts(drv, "pre.spec")), 15, "the spec")
        fits(drv, "the 400-round job page", width)
        assert top_of(drv, "#spec-h") < top_of(drv, "#files-h") < top_of(drv, "#ledger-h")
        assert "True" not in "".join(texts(drv, "pre.spec"))
        rounds = texts(drv, 'td[data-label="Round"]')
        assert rounds[:2] == ["400", "399"] and len(rounds) == 50, rounds[:3]
        cell = texts(drv, 'td[data-label="Contributors"]')[0]
        assert "samples/s" in cell and "samples_per_s" not in cell and "local steps" in cell
        assert height(drv, "svg.chart.loss") > 60 and not texts(drv, "svg.chart.loss circle")
        (shots / f"long-job-{width}.png").write_bytes(drv.get_screenshot_as_png())
        drv.execute_script("document.querySelector('.pager a[rel=next]').click()")
        wait_for(lambda: texts(drv, 'td[data-label="Round"]')[:1] == ["350"], 15, "the next page of rounds")
        fits(drv, "page 2 of the 400-round job", width)
        # The language-model job, still training: its adapter, labelled as not final.
        drv.get(f"{url}/jobs/{LLM_JOB}")
        wait_for(lambda: "adapter.zip" in "".join(texts(drv, ".downloads li")), 15, "the adapter link")
        fits(drv, "the language-model job page", width)
        items = texts(drv, ".downloads li")
        assert not any(i.startswith("model.pt") for i in items), items
        item = next(i for i in items if i.startswith("adapter.zip"))
        assert "round 4 of 10" in item and "still running" in item
        assert texts(drv, 'td[data-label="Perplexity"]')
        assert height(drv, "svg.chart.perplexity") > 60
        (shots / f"llm-job-{width}.png").write_bytes(drv.get_screenshot_as_png())
        # Join: the README's install, not a package index it is not on.
        drv.get(f"{url}/join")
        install = "".join(texts(drv, "#cmd-install"))
        assert "just setup" in install and "pip install gpuflex" not in install
        fits(drv, "the join page", width)
        (shots / f"join-{width}.png").write_bytes(drv.get_screenshot_as_png())


async def test_job_pages_at_375_and_1920_px(chromium: tuple[str, str], nursery: trio.Nursery,
                                             tmp_path: Path) -> None:
    served = await start(nursery, tmp_path)
    served.api.add_llm_and_long_jobs(long_rounds=400)
    shots = tmp_path / "shots"
    shots.mkdir()
    drv = await trio.to_thread.run_sync(make_driver, *chromium, tmp_path / "profile")
    try:
        await trio.to_thread.run_sync(check_pages, drv, served.url, shots)
    finally:
        await trio.to_thread.run_sync(drv.quit)
        await served.client.aclose()
    for name in ("long-job", "llm-job", "join"):
        for width, height in SIZES:
            data = (shots / f"{name}-{width}.png").read_bytes()
            assert png_size(data) == (width, height) and len(data) > 5000, name
