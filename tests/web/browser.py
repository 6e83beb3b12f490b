"""Headless Chromium for the portal's browser tests: found, or installed from Debian's packages
when the tests run as root, or a clear reason to skip. Driven by Selenium through chromedriver,
with no network beyond loopback (the flags stop Chromium's own background traffic)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PACKAGES = ("chromium", "chromium-driver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--disable-extensions", "--mute-audio", "--hide-scrollbars")


def _found() -> tuple[str, str] | None:
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def ensure_chromium() -> tuple[str, str] | str:
    """(browser, driver) paths, installing Debian's packages if needed; else why not."""
    found = _found()
    if found:
        return found
    if os.geteuid() != 0:
        return "Chromium is not installed and installing it needs root: apt-get install chromium chromium-driver"
    if shutil.which("apt-get") is None:
        return "Chromium is not installed and this machine has no apt-get to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    steps = [["apt-get", *lock, "update", "-q"],
             ["apt-get", *lock, "install", "-y", "-q", "--no-install-recommends", *PACKAGES]]
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(cmd)}` did not finish within 15 minutes"
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"`{' '.join(cmd)}` failed: {tail[0]}"
    return _found() or "apt-get installed Chromium but chromium or chromedriver is not on PATH"


def make_driver(browser: str, driver: str, profile: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_AVOID_STATS", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*FLAGS, f"--user-data-dir={profile}", "--window-size=1920,1080"):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(driver), options=options)
    # Selenium waits on chromedriver forever by default; a browser that hangs must fail the
    # test instead.
    executor: Any = drv.command_executor
    executor._client_config.timeout = 60
    drv.set_page_load_timeout(30)
    drv.set_script_timeout(10)
    return drv


def set_viewport(drv: Any, width: int, height: int) -> None:
    """An exact CSS viewport (a phone's at 375 px), so screenshots have exactly this size."""
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy; bounded in time."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as exc:  # a stale element while a region is swapped, say
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
