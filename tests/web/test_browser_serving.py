"""The portal's Serving page and playground in a real browser (headless Chromium), over a real
node that serves a tiny model: the page lists the node as a server, and a prompt typed into the
playground comes back with the answer plain transformers ``generate`` gives."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpuflex.localmesh import LocalMesh
from tests.integration.test_serving import tiny_model_dir
from tests.needs import needs
from tests.web.browser import make_driver, wait_for

pytestmark = [needs("transformers"), pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def node_and_browser(chromium: tuple[str, str], tmp_path: Path) -> Iterator[tuple[LocalMesh, Path, Any]]:
    model_dir = tiny_model_dir(tmp_path)
    mesh = LocalMesh(tmp_path / "mesh", 1, log_level="warning")
    mesh.home(0).mkdir(parents=True, exist_ok=True)
    (mesh.home(0) / "node.toml").write_text(f'[serve]\nhttp = ""\n[serve.models]\ntiny = "{model_dir}"\n')
    with ThreadPoolExecutor(1) as pool:
        launching = pool.submit(make_driver, *chromium, tmp_path / "profile")
        drv = None
        try:
            mesh.start(timeout=120)
            drv = launching.result(timeout=120)
            yield mesh, model_dir, drv
        finally:
            if drv is None:
                drv = launching.result(timeout=120)
            drv.quit()
            mesh.close()


def test_the_playground_answers_a_prompt_typed_in_the_browser(node_and_browser: tuple[LocalMesh, Path, Any]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mesh, model_dir, drv = node_and_browser
    proc = subprocess.Popen([sys.executable, "-m", "gpuflex", "web", "--home", str(mesh.home(0)), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        match = re.search(r"on (http://127\.0\.0\.1:\d+)/", proc.stdout.readline())
        assert match
        url = match.group(1)
        peer = mesh.call(0, "status")["peer_id"]
        drv.get(url + "/serving")

        def listed() -> bool:
            return bool(drv.find_elements(By.CSS_SELECTOR, f'#servers tr[data-peer="{peer}"]'))
        wait_for(listed, 60, "the node in the servers table")  # live: it appears once it has loaded
        drv.find_element(By.LINK_TEXT, "Open the playground").click()
        Select(drv.find_element(By.ID, "pg-model")).select_by_value("tiny")
        drv.find_element(By.ID, "pg-prompt").send_keys("ROMEO:")
        box = drv.find_element(By.ID, "pg-max")
        box.clear()
        box.send_keys("12")
        drv.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
        try:
            mark = wait_for(lambda: drv.find_elements(By.CSS_SELECTOR, "#pg-answer mark, #pg-problem"), 120,
                            "the answer")[0]
        except AssertionError:
            raise AssertionError(f"no answer; the page: {drv.page_source[-3000:]}") from None
        assert mark.tag_name == "mark", mark.text
        answer = mark.get_attribute("textContent")
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        ids = tok("ROMEO:", return_tensors="pt").input_ids
        ref = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False, pad_token_id=256)
        expected = tok.decode(ref[0, ids.shape[1]:], skip_special_tokens=True)
        # As HTML parsing hands text over: line ends normalised, a NUL replaced.
        expected = expected.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "\ufffd")
        assert answer == expected, (answer, expected)
        assert peer[-6:] in drv.find_element(By.CSS_SELECTOR, "#pg-answer .sub").get_attribute("innerHTML")
        assert mesh.call(0, "status")["serve"]["models"][0]["requests"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
