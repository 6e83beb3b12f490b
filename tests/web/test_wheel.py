"""The Join page offers the node's own wheel: one known file name, served read-only, with its
SHA-256; nothing in a request is a path."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx
import trio

from gpuflex_web.app import Portal
from gpuflex_web.exports import Exporter
from gpuflex_web.server import serve
from gpuflex_web.wheel import wheel_dirs
from tests.tui.fake_source import NOW
from tests.web.fake_api import FakeApi

VERSION = "9.8.7"
NAME = f"gpuflex-{VERSION}-py3-none-any.whl"


async def portal(nursery: trio.Nursery, tmp_path: Path, dirs: list[Path],
                 token: str | None = None) -> httpx.AsyncClient:
    api = FakeApi()
    app = Portal(api, token=token, exporter=Exporter(api, tmp_path / "exports"), wall_clock=lambda: NOW,
                 version=VERSION, wheel_dirs=dirs)
    url = await nursery.start(serve, app, "127.0.0.1", 0)
    return httpx.AsyncClient(base_url=url, timeout=10, headers={"accept": "text/html"})


def put_wheel(folder: Path, payload: bytes) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / NAME).write_bytes(payload)
    return hashlib.sha256(payload).hexdigest()


async def test_join_offers_the_wheel_and_serves_its_bytes(nursery: trio.Nursery, tmp_path: Path) -> None:
    payload = os.urandom(300_000)
    digest = put_wheel(tmp_path / "home" / "dist", payload)
    async with await portal(nursery, tmp_path, [tmp_path / "src-dist", tmp_path / "home" / "dist"]) as client:
        html = (await client.get("/join")).text
        assert f'href="/dist/{NAME}"' in html and f"({VERSION})" in html
        assert f'echo "{digest}  {NAME}" | sha256sum -c -' in html
        assert f'python -m pip install "./{NAME}"' in html
        resp = await client.get(f"/dist/{NAME}")
        assert resp.status_code == 200 and resp.content == payload
        assert resp.headers["x-checksum-sha256"] == digest
        assert NAME in resp.headers["content-disposition"]
        # A rebuilt wheel (new bytes, new mtime) is hashed again.
        newer = os.urandom(1000)
        digest2 = put_wheel(tmp_path / "home" / "dist", newer)
        os.utime(tmp_path / "home" / "dist" / NAME, ns=(1, 10**18))
        assert digest2 in (await client.get("/join")).text
        assert (await client.get(f"/dist/{NAME}")).content == newer


async def test_only_the_one_wheel_name_is_served(nursery: trio.Nursery, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    put_wheel(dist, b"wheel")
    (dist / "gpuflex-0.0.1-py3-none-any.whl").write_bytes(b"an older version")
    (dist / "secret.txt").write_text("not for the web")
    async with await portal(nursery, tmp_path, [dist]) as client:
        for path in ("/dist/gpuflex-0.0.1-py3-none-any.whl", "/dist/secret.txt", "/dist/..%2Fsecret.txt",
                     "/dist/%2E%2E%2Fdist%2F" + NAME, f"/dist/{NAME}%00", "/dist/" + NAME.upper()):
            resp = await client.get(path)
            assert resp.status_code == 404, path
            assert b"not for the web" not in resp.content and b"older" not in resp.content


async def test_without_a_wheel_the_page_says_how_to_build_one(nursery: trio.Nursery, tmp_path: Path) -> None:
    async with await portal(nursery, tmp_path, [tmp_path / "nothing"]) as client:
        html = (await client.get("/join")).text
        assert "<code>just dist</code> in its source copy" in html and "/dist/" not in html
        assert (await client.get(f"/dist/{NAME}")).status_code == 404


async def test_the_wheel_is_behind_the_login_like_every_page(nursery: trio.Nursery, tmp_path: Path) -> None:
    put_wheel(tmp_path / "dist", b"wheel")
    async with await portal(nursery, tmp_path, [tmp_path / "dist"], token="t" * 32) as client:
        resp = await client.get(f"/dist/{NAME}")
        assert resp.status_code != 200 and resp.content != b"wheel"


def test_the_portal_looks_in_the_source_dist_then_the_home(tmp_path: Path) -> None:
    # (Between them: where pip installed this copy from; tests/packaging/test_dist.py checks it.)
    dirs = wheel_dirs(tmp_path)
    assert dirs[0] == Path(__file__).resolve().parents[2] / "dist" and dirs[-1] == tmp_path / "dist"


async def test_the_join_page_with_a_wheel_fits_a_phone_and_a_desktop(nursery: trio.Nursery, tmp_path: Path) -> None:
    import pytest

    from tests.web.browser import ensure_chromium, make_driver, set_viewport

    found = ensure_chromium()
    if isinstance(found, str):
        pytest.skip(found)
    put_wheel(tmp_path / "dist", b"wheel")
    async with await portal(nursery, tmp_path, [tmp_path / "dist"]) as client:
        url = str(client.base_url).rstrip("/") + "/join"

        def check() -> list[tuple[int, int, str]]:
            from selenium.webdriver.common.by import By

            drv = make_driver(*found, tmp_path / "profile")
            try:
                drv.get(url)
                seen = []
                for width, height in ((375, 812), (1920, 1080)):
                    set_viewport(drv, width, height)
                    overflow = drv.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
                    link = drv.find_element(By.CSS_SELECTOR, f'a[href="/dist/{NAME}"]')
                    seen.append((width, int(overflow), str(link.text)))
                return seen
            finally:
                drv.quit()

        seen = await trio.to_thread.run_sync(check)
    assert seen == [(375, seen[0][1], NAME), (1920, seen[1][1], NAME)]
    assert all(overflow <= 0 for _, overflow, _ in seen), seen
