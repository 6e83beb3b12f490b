"""The portal in a real browser (headless Chromium) against a real 3-node mesh on loopback.

One mesh, one `gpuflex web` process and one browser serve the whole module, in this order:
the overview follows the demo job live, the audit button verifies the chain, the contributions
CSV matches `gpuflex audit show`, screenshots at 375 and 1920 px, a killed peer turns `down`,
and last the watched node stops and the portal says it is retrying.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuflex.cli.main import app as cli
from gpuflex.localmesh import LocalMesh
from tests.integration.conftest import digits_spec
from tests.web.browser import ensure_chromium, make_driver, png_size, set_viewport, wait_for
from tests.web.fake_api import HOSTILE_NAME

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

ROUNDS = 6
PAGES = ("overview", "peers", "jobs", "job", "contributions", "join")
SIZES = ((1920, 1080), (375, 812))
DOCS_SHOT = os.environ.get("GPUFLEX_WEB_DOCS_SHOT")
"""Set to a path to also write the overview at 1920 px there, made small (the README's copy):
GPUFLEX_WEB_DOCS_SHOT=docs/web-portal.png just test tests/web/test_browser.py"""


@pytest.fixture(scope="module")
def chromium() -> tuple[str, str]:
    found = ensure_chromium()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def mesh_and_browser(chromium: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[tuple[LocalMesh, Any]]:
    """The mesh's nodes start while Chromium does, in a thread beside them: the two waits
    overlap instead of adding up."""
    m = LocalMesh(tmp_path_factory.mktemp("webmesh"), 3, log_level="warning",
                  extra_args=["--suspect-after", "1", "--down-after", "3"])
    with ThreadPoolExecutor(1) as pool:
        launching = pool.submit(make_driver, *chromium, tmp_path_factory.mktemp("chromium-profile"))
        drv = None
        try:
            m.start(timeout=120)
            m.wait_connected(60)
            drv = launching.result(timeout=120)
            set_viewport(drv, 1920, 1080)
            yield m, drv
        finally:
            if drv is None and launching.done() and launching.exception() is None:
                drv = launching.result()
            if drv is not None:
                drv.quit()
            m.close()


@pytest.fixture(scope="module")
def mesh(mesh_and_browser: tuple[LocalMesh, Any]) -> LocalMesh:
    return mesh_and_browser[0]


@pytest.fixture(scope="module")
def browser(mesh_and_browser: tuple[LocalMesh, Any]) -> Any:
    return mesh_and_browser[1]


@pytest.fixture(scope="module")
def portal(mesh: LocalMesh) -> Iterator[str]:
    """`gpuflex web` as a user runs it, on an ephemeral loopback port; its first line names it."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuflex", "web", "--home", str(mesh.home(0)),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
        assert match, f"gpuflex web said: {line!r}"
        yield match.group(1)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("web-screenshots")


@pytest.fixture(scope="module")
def state() -> dict[str, Any]:
    return {}


def text_of(drv: Any, css: str) -> str:
    """The element's text; a live update may swap the element out between finding and
    reading it, so a stale one is looked up again."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(4):
        try:
            return str(drv.find_element(By.CSS_SELECTOR, css).text)
        except StaleElementReferenceException:
            time.sleep(0.05)
    return str(drv.find_element(By.CSS_SELECTOR, css).text)


def no_alert(drv: Any) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        drv.switch_to.alert  # noqa: B018 - raises when there is none
    except NoAlertPresentException:
        return True
    return False


def save_small_png(src: Path, dest: Path) -> None:
    """The README's copy: the same screenshot in a 256-colour palette, a third of the bytes."""
    from PIL import Image

    with Image.open(src) as img:
        img.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(dest, optimize=True)


def snap(drv: Any, shots: Path, name: str) -> None:
    """Screenshots of the page on screen at each size in SIZES (no reload: the viewport is
    resized in place), after checking the page fits the width with no sideways scrolling."""
    try:
        for width, height in SIZES:
            set_viewport(drv, width, height)
            overflow = drv.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name} is wider than {width} px by {overflow} px"
            (shots / f"{name}-{width}.png").write_bytes(drv.get_screenshot_as_png())
    finally:
        set_viewport(drv, 1920, 1080)


def test_round_counter_advances_on_the_overview(mesh: LocalMesh, portal: str, browser: Any,
                                                 state: dict[str, Any], shots: Path) -> None:
    browser.get(portal + "/")
    browser.execute_script("window.gpuflexLoaded = true")  # gone if the page ever reloads
    job = state["job"] = mesh.submit(digits_spec(rounds=ROUNDS, local_epochs=1, name="digits"))
    seen: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(seen) < 3:
        try:
            value = int(text_of(browser, f"#job-{job}-round"))
        except Exception:
            value = None
        if value is not None and (not seen or value != seen[-1]):
            seen.append(value)
        if seen and seen[-1] == ROUNDS:
            break
        time.sleep(0.1)
    assert len(seen) >= 2, f"the round counter never advanced: {seen}"
    assert seen == sorted(seen)
    assert browser.execute_script("return window.gpuflexLoaded === true"), "the page reloaded"
    snap(browser, shots, "overview")
    if DOCS_SHOT:
        save_small_png(shots / "overview-1920.png", Path(DOCS_SHOT))
    # A second, one-round job whose name is peer text that must never run as markup; it runs
    # beside the first one while the next test waits.
    state["hostile"] = mesh.submit(digits_spec(rounds=1, local_epochs=1, name=HOSTILE_NAME))


def test_audit_button_reports_the_chain_verified(mesh: LocalMesh, portal: str, browser: Any,
                                                 state: dict[str, Any], shots: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    job = state["job"]
    mesh.wait_job(job, [0, 1, 2], timeout=180)
    browser.get(f"{portal}/jobs/{job}")
    wait_for(lambda: text_of(browser, f"#job-{job}-round") == str(ROUNDS), 10, "the last round")
    browser.find_element(By.ID, "audit-button").send_keys(Keys.ENTER)  # the keyboard alone
    verdict = wait_for(lambda: (t := text_of(browser, "#audit-result")) and "Auditing" not in t and t,
                       60, "the audit verdict")
    assert verdict.startswith("Chain verified"), verdict
    assert f"{ROUNDS} rounds of job {job}" in verdict
    # The results hand out the best-scored round's model (the job's default final_model).
    rows = mesh.call(0, "ledger", {"job": job})
    best = max(rows, key=lambda r: (r["metrics"]["accuracy"], r["round"]))["round"]
    assert f"the model matches round {best}" in verdict
    wait_for(lambda: "digits" in text_of(browser, "[data-region=spec]"), 30, "the job spec")
    snap(browser, shots, "job")
    browser.get(f"{portal}/jobs")
    snap(browser, shots, "jobs")


def test_contributions_csv_matches_audit_show(mesh: LocalMesh, portal: str, browser: Any,
                                              state: dict[str, Any], shots: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    hostile = state["hostile"]
    mesh.wait_job(hostile, [0, 1, 2], timeout=120)
    browser.get(f"{portal}/jobs/{hostile}")
    assert text_of(browser, "h1") == f"Job {HOSTILE_NAME}"  # shown as text, never run
    assert no_alert(browser)
    browser.get(portal + "/contributions")
    wait_for(lambda: "in 2 jobs" in text_of(browser, "[data-region=credit]"), 10, "both jobs")
    href = browser.find_element(By.ID, "csv-link").get_attribute("href")
    with urllib.request.urlopen(href, timeout=10) as resp:
        rows = list(csv.DictReader(io.StringIO(resp.read().decode())))
    expected: dict[str, list[int]] = {}
    credited: dict[str, int] = {}
    for job, rounds in ((state["job"], ROUNDS), (hostile, 1)):
        out = tmp_path / job
        mesh.call(0, "job_results", {"job": job, "out": str(out)}, timeout=120)
        # `gpuflex audit show --json`, run in this process (the same command, without a
        # second interpreter start).
        result = CliRunner().invoke(cli, ["audit", "show", "--json", str(out / "ledger.msgpack")])
        assert result.exit_code == 0, result.output
        shown = json.loads(result.stdout)
        assert len(shown["rounds"]) == rounds
        for peer, steps in shown["credit"].items():
            credited[peer] = credited.get(peer, 0) + steps
        for rnd in shown["rounds"]:
            for c in rnd["contributors"]:
                cell = expected.setdefault(c["peer"], [0, 0])
                cell[0] += 1
                cell[1] += c["samples"]
    assert len(expected) == 3
    assert {r["peer"]: [int(r["rounds"]), int(r["samples"])] for r in rows} == expected
    assert all(r["jobs"] == "2" for r in rows)
    # With one local epoch, the audit's credit (sample-steps) is each peer's samples too.
    assert credited == {r["peer"]: int(r["samples"]) for r in rows}
    assert abs(sum(float(r["compute_share"]) for r in rows) - 1.0) < 1e-4
    snap(browser, shots, "contributions")
    browser.get(portal + "/join")
    assert mesh.call(0, "status")["addrs"][0] in text_of(browser, "#cmd-join")
    snap(browser, shots, "join")


def test_killed_peer_turns_down_on_the_peers_page(mesh: LocalMesh, portal: str, browser: Any,
                                                  shots: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    victim = mesh.call(2, "status")["peer_id"]
    browser.get(portal + "/peers")
    state_css = f'tr[data-peer="{victim}"] [data-state]'
    wait_for(lambda: text_of(browser, state_css) == "up", 15, "the peer up")
    browser.execute_script("window.gpuflexLoaded = true")
    box = browser.find_element(By.ID, "peer-filter")  # the filter, typed: one row stays
    box.send_keys(victim[-10:])
    wait_for(lambda: text_of(browser, "[data-shown]") == "1", 5, "the filter")
    mesh.kill(2)
    wait_for(lambda: text_of(browser, state_css) == "down", 30, "the killed peer shown down")
    assert browser.execute_script("return window.gpuflexLoaded === true"), "the page reloaded"
    assert text_of(browser, "[data-shown]") == "1"  # the filter holds across live updates
    box.send_keys(Keys.CONTROL, "a", Keys.DELETE)
    wait_for(lambda: text_of(browser, "[data-shown]") == "2", 5, "the filter cleared")
    snap(browser, shots, "peers")


def test_stopped_node_shows_disconnected_retrying(mesh: LocalMesh, portal: str, browser: Any) -> None:
    browser.get(portal + "/")
    wait_for(lambda: text_of(browser, "#mesh-size"), 10, "the overview")
    mesh.kill(0)
    banner = wait_for(lambda: "Disconnected, retrying" in (t := text_of(browser, "#banner")) and t,
                      20, "the disconnected banner")
    assert "does not answer" in banner
    assert text_of(browser, "#mesh-size")  # the last data stays on screen


def test_screenshots_are_images_of_both_sizes(shots: Path) -> None:
    for name in PAGES:
        for width, height in SIZES:
            data = (shots / f"{name}-{width}.png").read_bytes()
            assert png_size(data) == (width, height), name
            assert len(data) > 5000, f"{name} at {width} px looks blank"
    print(f"\nscreenshots in {shots}")
