"""The administrative console in a real headless browser (Chromium through Selenium):
the page loads from a super and shows every process with its health (a killed router
included), a client at work, the ring as a table and a picture, and the history the
super kept (charts and events on a fresh load); an expand from its form asks first,
takes effect and prints its plan as text.  The screenshot is checked pixel by pixel
(the ring's colors, the chart's line).  ``ECAST_UPDATE_SCREENSHOT=1`` writes the
screenshot that ``docs/operations.md`` shows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
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


def processes(b: webdriver.Chrome) -> list[tuple[str, str, str]]:
    """``(role, name, health)`` of every row of the processes table, in one call."""
    rows = b.execute_script(
        "return [...document.querySelectorAll('#processes tbody tr')].map("
        "r => [r.dataset.role, r.dataset.name, r.cells[2].textContent])"
    )
    return [tuple(r) for r in rows]


def fill(browser: webdriver.Chrome, op: str, a1: str, a2: str) -> None:
    """The reconfiguration form: its operation and both arguments, as typed."""
    Select(browser.find_element(By.ID, "op")).select_by_visible_text(op)
    for field, value in (("a1", a1), ("a2", a2)):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)


def colors_in(png: Image.Image, element: Any) -> Counter[tuple[int, int, int]]:
    """The pixels of ``element``'s box in a screenshot, by color."""
    r = element.rect
    box = png.crop((int(r["x"]), int(r["y"]), int(r["x"] + r["width"]), int(r["y"] + r["height"])))
    return Counter(box.convert("RGB").getdata())


def rgb(hex_color: str) -> tuple[int, int, int]:
    return (int(hex_color[1:3], 16), int(hex_color[3:5], 16), int(hex_color[5:7], 16))


def test_the_console_shows_every_process_the_ring_its_history_and_runs_an_expand(
    cluster: Path, browser: webdriver.Chrome
) -> None:
    st = json.loads((cluster / "cluster.json").read_text())
    (address,) = st["supers"].values()

    def login() -> None:
        browser.get(f"http://{address}/console")
        assert "Rubberband console" in browser.title
        browser.find_element(By.ID, "token").clear()
        browser.find_element(By.ID, "token").send_keys(st["admin_token"])
        browser.find_element(By.CSS_SELECTOR, "#login button").click()

    login()
    until("the ring", lambda: ring(browser) == [f"storage:{i}" for i in range(1, 5)])
    assert "storage:5" in text(browser, "standby")
    # Every process with its health: the routers (one leads), the super, the storage
    # processes on the ring and in standby, and the clients.
    rows = until("every process", lambda: len(processes(browser)) >= 10 and processes(browser))
    routers = {n: h for role, n, h in rows if role == "router"}
    assert routers == {"r1": "up", "r2": "up", "r3": "up"}, rows
    assert ("super", "super:s1", "up") in rows
    assert [(n, h) for role, n, h in rows if role == "storage"] == [
        *((f"storage:{i}", "active") for i in range(1, 5)),
        ("storage:5", "standby"),
    ]
    version = text(browser, "fact-version").split()[-1]

    Select(browser.find_element(By.ID, "op")).select_by_visible_text("expand")
    browser.find_element(By.ID, "a1").send_keys("storage:5")
    browser.find_element(By.ID, "a2").send_keys("875000")
    browser.find_element(By.ID, "plan").click()  # a dry run shows the plan, changes nothing
    until("the plan", lambda: "(nothing changed)" in text(browser, "result"))
    plan = text(browser, "result")
    assert plan.startswith(f"dry run: expand storage:5 875000 from version {version}"), plan
    assert "copy " in plan and '"submitted"' not in plan  # the plan as text, not JSON
    # A run asks first: declined, nothing runs.
    browser.find_element(By.ID, "run").click()
    until("the question", lambda: "storage:5" in browser.switch_to.alert.text)
    browser.switch_to.alert.dismiss()
    until("nothing run", lambda: text(browser, "result") == "not run")
    assert text(browser, "fact-version") == f"version: {version}"
    browser.find_element(By.ID, "run").click()
    until("the question", lambda: browser.switch_to.alert.text)
    browser.switch_to.alert.accept()
    until(
        "the new ring",
        lambda: ring(browser) == [*(f"storage:{i}" for i in range(1, 5)), "storage:5"],
        timeout=60,
    )
    until("the outcome", lambda: "expand storage:5 875000: version" in text(browser, "result"))
    new_version = text(browser, "fact-version").split()[-1]
    assert new_version != version
    status = json.loads(cli("cluster", "status", "--state-dir", str(cluster), "--json").stdout)
    assert [r["name"] for r in status["ring"]][-1] == "storage:5"

    # A refused request shows its reason and changes nothing.
    fill(browser, "replace", "storage:1", "storage:2")
    browser.find_element(By.ID, "run").click()
    until("the question", lambda: browser.switch_to.alert.text)
    browser.switch_to.alert.accept()
    until("the refusal", lambda: "refused (409)" in text(browser, "result"))

    # A client at work shows as one, by name, while it writes (a light client joins no
    # group: the storage processes report whom they heard).
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

    writer = threading.Thread(target=asyncio.run, args=(write(8.0),))
    writer.start()
    try:
        until("the client", lambda: text(browser, "fact-clients") == "clients: 1", timeout=8)
        assert ("clients", "1", "at work") in processes(browser)
        assert "client:console-load" in browser.execute_script(
            "return document.querySelector('#processes tr[data-role=clients]').textContent"
        )
    finally:
        writer.join()

    # A materialized view's progress and staleness, as its maintainer reports them.
    async def define() -> None:
        rb = await rubberband.connect(
            st["routers"], "maintainer:console-views", credentials=st["maintainer_credentials"]
        )
        try:
            await rb.create_view("totals", (0, 1_000_000), "aggregate",
                                 aggregates={"n": ["count", None]})  # fmt: skip
        finally:
            await rb.close()

    asyncio.run(define())
    maintainer = subprocess.Popen(
        [sys.executable, "-m", "rubberband.tools.cli", "views", "maintain", "--state-dir",
         str(cluster)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        row = until("the view", lambda: browser.execute_script(
            "const r = document.querySelector('#views tr[data-name=totals]');"
            "return r && [...r.cells].map(c => c.textContent)"), timeout=30)  # fmt: skip
        _name, who, position, behind, stale, rows, age = row
        assert who.startswith("maintainer:") and int(position) > 0 and int(behind) >= 0
        assert 0 <= float(stale) < 30 and int(rows) == 1 and float(age) < 5, row
        # A place among the view's rows, typed as a JSON array, is a tuple key: the
        # plan names it as typed, and a dry run changes nothing.
        version = text(browser, "fact-version")
        fill(browser, "rebalance", "storage:5", '["~view", "totals", 0]')
        browser.find_element(By.ID, "plan").click()
        until("the tuple key's plan", lambda: "(nothing changed)" in text(browser, "result"))
        plan = text(browser, "result")
        assert plan.startswith('dry run: rebalance storage:5 ["~view","totals",0] from'), plan
        assert text(browser, "fact-version") == version
        # Two processes taken off together, typed in one field: one plan for both.
        fill(browser, "contract", "storage:1, storage:2", "")
        browser.find_element(By.ID, "plan").click()
        until(
            "the plan of two",
            lambda: text(browser, "result").startswith("dry run: contract storage:1 storage:2 "),
        )
        assert "(nothing changed)" in text(browser, "result")
        assert text(browser, "fact-version") == version
    finally:
        maintainer.kill()
        maintainer.wait()

    # Events polled live (each poll asks for what came after the last sample) show once.
    live = browser.execute_script(
        "return [...document.querySelectorAll('#events div')].map(d => d.textContent)"
    )
    assert any("refused" in line for line in live) and len(live) == len(set(live)), live

    # A killed router shows as down, not only as a new leader.
    follower = next(n for n in ("r1", "r2", "r3") if n != status["leader"])
    pid = json.loads((cluster / "processes.json").read_text())[follower]["pid"]
    os.kill(pid, signal.SIGKILL)
    until(
        f"{follower} down",
        lambda: any(n == follower and h != "up" for r, n, h in processes(browser) if r == "router"),
        timeout=15,
    )

    # A fresh page has the charts and the history at once: the super kept them.
    login()
    until("the charts", lambda: float(text(browser, "ops-now") or -1) >= 0, timeout=5)
    history = until("the history", lambda: text(browser, "events"))
    assert f"expand storage:5 875000: version {new_version}" in history, history
    assert "on the ring storage:5" in history and "replace storage:1 storage:2 refused" in history
    shot = (
        ROOT / "docs" / "img" / "console.png"
        if os.environ.get("ECAST_UPDATE_SCREENSHOT") == "1"
        else cluster / "console.png"
    )
    time.sleep(1.5)  # one more redraw, so that nothing is half drawn
    lines = browser.execute_script(
        "return [...document.querySelectorAll('#events div')].map(d => d.textContent)"
    )
    assert len(lines) == len(set(lines)), lines  # each event once, however often polled
    assert browser.save_screenshot(str(shot))
    png = Image.open(shot)
    # The ring picture: five storage processes, five colors of the palette.
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    ring_pixels = colors_in(png, browser.find_element(By.ID, "ringpic"))
    assert all(ring_pixels[rgb(c)] > 200 for c in palette), ring_pixels.most_common(8)
    # The throughput chart drew the load of the writes (its line color), from the
    # super's history although the page was just loaded.
    chart = colors_in(png, browser.find_element(By.ID, "ops"))
    assert chart[rgb("#1f77b4")] > 50, chart.most_common(5)
