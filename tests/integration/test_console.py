"""The administrative console in a real headless browser (Chromium through Selenium):
the page loads from a super, shows the ring, and an expand submitted from its form takes
effect and shows in the ring.  ``ECAST_UPDATE_SCREENSHOT=1`` writes the screenshot that
``docs/operations.md`` shows."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.integration.test_rubberband import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "rb"
    up = cli("cluster", "up", "--routers", "3", "--supers", "1", "--storage", "4",
             "--state-dir", str(d))  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        added = cli("cluster", "add", "--storage", "1", "--state-dir", str(d))
        assert added.returncode == 0, added.stderr
        yield d
    finally:
        cli("cluster", "down", "--state-dir", str(d))


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert binary and driver, "Chromium and its driver are needed (.ci/run installs them)"
    options = Options()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(flag)
    b = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield b
    finally:
        b.quit()


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def ring(b: webdriver.Chrome) -> list[str]:
    """The ring as the page shows it, read in one script call: the page redraws every
    second, so elements found in one call may be gone in the next."""
    return list(
        b.execute_script(
            "return [...document.querySelectorAll('#ring tbody tr')].map(r => r.dataset.name)"
        )
    )


def text(b: webdriver.Chrome, element_id: str) -> str:
    return str(
        b.execute_script(
            "const e = document.getElementById(arguments[0]); return e ? e.textContent : ''",
            element_id,
        )
    )


def test_the_console_shows_the_ring_and_runs_an_expand(
    cluster: Path, browser: webdriver.Chrome
) -> None:
    st = json.loads((cluster / "cluster.json").read_text())
    (address,) = st["supers"].values()
    browser.get(f"http://{address}/console")
    assert "Rubberband console" in browser.title
    browser.find_element(By.ID, "token").send_keys(st["admin_token"])
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    until("the ring", lambda: ring(browser) == [f"storage:{i}" for i in range(1, 5)])
    assert "storage:5" in text(browser, "standby")
    version = text(browser, "fact-version")

    Select(browser.find_element(By.ID, "op")).select_by_visible_text("expand")
    browser.find_element(By.ID, "a1").send_keys("storage:5")
    browser.find_element(By.ID, "a2").send_keys("875000")
    browser.find_element(By.ID, "plan").click()  # a dry run shows the plan, changes nothing
    until("the plan", lambda: '"submitted": false' in text(browser, "result"))
    assert text(browser, "fact-version") == version
    browser.find_element(By.ID, "run").click()
    until(
        "the new ring",
        lambda: ring(browser) == [*(f"storage:{i}" for i in range(1, 5)), "storage:5"],
        timeout=60,
    )
    assert '"submitted": true' in text(browser, "result")
    assert text(browser, "fact-version") != version
    status = json.loads(cli("cluster", "status", "--state-dir", str(cluster), "--json").stdout)
    assert [r["name"] for r in status["ring"]][-1] == "storage:5"

    # A refused request shows its reason and changes nothing.
    Select(browser.find_element(By.ID, "op")).select_by_visible_text("replace")
    browser.find_element(By.ID, "a1").clear()
    browser.find_element(By.ID, "a1").send_keys("storage:1")
    browser.find_element(By.ID, "a2").clear()
    browser.find_element(By.ID, "a2").send_keys("storage:2")
    browser.find_element(By.ID, "run").click()
    until("the refusal", lambda: "refused (409)" in text(browser, "result"))

    # Load for the charts: a client writes for a few seconds while the page draws.
    import asyncio

    import rubberband

    async def write(seconds: float) -> None:
        rb = await rubberband.connect(
            st["routers"], "client:console-load", credentials=st["client_credentials"]
        )
        try:
            end = time.monotonic() + seconds
            n = 0
            while time.monotonic() < end:
                await rb.put_many({(n * 50 + i) * 997 % 1_000_000: n for i in range(50)})
                n += 1
        finally:
            await rb.close()

    asyncio.run(write(8.0))
    until("load on the chart", lambda: float(text(browser, "ops-now") or 0) > 0, timeout=5)
    shot = (
        ROOT / "docs" / "img" / "console.png"
        if os.environ.get("ECAST_UPDATE_SCREENSHOT") == "1"
        else cluster / "console.png"
    )
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
