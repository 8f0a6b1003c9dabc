"""The run explorer as its tests drive it: `rollwire explore` on a run, its page in Debian's Chromium
(headless, through Debian's chromedriver and Selenium; nothing downloaded), and what a user looks at.

With `ROLLWIRE_SCREENSHOTS=DIR` set, each view a test opens is saved there as `explore-<view>.png`
(`docs/` holds the ones the documentation shows)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
INSTALL = "apt-get install chromium chromium-driver (`.ci/run` does)"


@contextmanager
def explorer(*args: str, timeout_s: float = 120) -> Iterator[str]:
    """`rollwire explore ARGS --port 0` running; yields its URL. Stopped (SIGTERM, then SIGKILL) after.
    Its output goes to a file (a pipe nobody reads could fill and stop it)."""
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen([sys.executable, "-m", "rollwire", "explore", "--port", "0", *args],
                                   stdout=output, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                output.seek(0)
                text = output.read()
                if found := re.search(r"the run explorer of \S+: (http://\S+/)", text):
                    break
                assert process.poll() is None, f"rollwire explore exited ({process.returncode}):\n{text[-3000:]}"
                assert time.monotonic() < deadline, f"rollwire explore did not listen within {timeout_s} s:\n{text[-3000:]}"
                time.sleep(0.3)
            yield found[1]
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


@contextmanager
def browser() -> Iterator:
    """A headless Chromium at 1400x1000."""
    missing = [path for path in (CHROMEDRIVER, CHROMIUM) if not shutil.which(path)]
    assert not missing, f"{missing} not found: {INSTALL}"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, condition, timeout_s: float = 60, what: str = "the page") -> object:
    """`condition(driver)` once it is truthy; fails naming `what` and the page's error line after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = condition(driver)
        except Exception:  # the element not there yet
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            summary = driver.find_element("id", "summary").text if driver.find_elements("id", "summary") else ""
            raise AssertionError(f"{what} did not appear within {timeout_s} s (summary line: {summary!r})")
        time.sleep(0.5)


def points(driver, chart: str, *, full: bool = False) -> int:
    """How many points a chart of the Curves view holds (`full`: with a value in every series)."""
    return int(driver.find_element("id", chart).get_attribute("data-full" if full else "data-points") or 0)


def open_view(driver, view: str) -> None:
    driver.find_element("id", f"tab-{view}").click()


def screenshot(driver, view: str) -> None:
    folder = os.environ.get("ROLLWIRE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        time.sleep(1.0)  # the last fetch drawn
        driver.save_screenshot(str(Path(folder) / f"explore-{view}.png"))


def open_rollout(driver, *, fate: str = "", reason: str = "", timeout_s: float = 60) -> str:
    """Filters the Rollouts view by `fate` (and a dropped rollout's `reason`), opens the first rollout
    listed; returns its id. The row is found and clicked inside the page in one step: the view
    redraws its table as the run goes."""
    from selenium.webdriver.support.ui import Select

    open_view(driver, "rollouts")
    Select(driver.find_element("css selector", "#rollout-filters select[name=fate]")).select_by_visible_text(fate or "any")
    reason_box = driver.find_element("css selector", "#rollout-filters input[name=reason]")
    reason_box.clear()
    reason_box.send_keys(reason)
    driver.find_element("css selector", "#rollout-filters button[type=submit]").click()
    pick = """const row = [...document.querySelectorAll('#rollout-table tbody tr.rollout')]
                .find((r) => r.cells[5].textContent.startsWith(arguments[0]));
              if (!row) return null; row.click(); return row.dataset.id;"""
    rollout_id = wait_for(driver, lambda d: d.execute_script(pick, fate), timeout_s,
                          what=f"a rollout listed (fate {fate or 'any'})")
    wait_for(driver, lambda d: d.find_element("css selector", "#rollout-detail h2").text == rollout_id, timeout_s,
             what=f"rollout {rollout_id}'s story")
    return str(rollout_id)
