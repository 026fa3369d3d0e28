"""The live dashboard in a real headless Chromium during a two-policy run: it logs in,
shows both policies, a node that joins mid-run, and a weight refresh of a new version
reaching a node; without the token the data gets 401."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from launched_runs import reaped, start_run, wait_for

TOKEN = "dashboard-test-token"


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium")
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("needs Chromium and its driver: `make install` installs them as root "
                    "(apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1800", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(arg)
    opts.binary_location = chromium
    drv = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def join(run_dir: Path, name: str) -> subprocess.Popen:
    url = (run_dir / "store" / "url").read_text().strip()
    return subprocess.Popen(
        [sys.executable, "-m", "astraflow", "raas", "--connect", url, "--config",
         str(run_dir / "config.yaml"), "--work-dir", str(run_dir.parent / name), "--name",
         name, "--pool", "late", "--region", "elsewhere", "--concurrency", "2"],
        stdout=(run_dir.parent / f"{name}.log").open("w"), stderr=subprocess.STDOUT,
        env=dict(os.environ, ASTRAFLOW_TOKEN=TOKEN, OMP_NUM_THREADS="1"))


def test_the_dashboard_follows_a_two_policy_run_in_a_browser(tmp_path, tiny_model_dir,
                                                              browser, monkeypatch):
    monkeypatch.setenv("ASTRAFLOW_TOKEN", TOKEN)
    run_dir = tmp_path / "run"
    launcher = start_run(run_dir, tiny_model_dir, "workflow=solve_verify", "steps=200",
                         "eval_every=10", "raas.generation_seconds=0.3")
    joined: list[subprocess.Popen] = []
    with reaped(launcher):
        try:
            watch(browser, run_dir, launcher, joined)
        finally:
            for node in joined:  # whatever failed, the node started here goes too
                if node.poll() is None:
                    node.send_signal(signal.SIGTERM)
                    try:
                        node.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        node.kill()
    browser.save_screenshot(str(tmp_path / "dashboard.png"))


def watch(browser, run_dir: Path, launcher: subprocess.Popen,
          joined: list[subprocess.Popen]) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait_for(lambda: (run_dir / "store" / "url").exists(), 120, "the data layer", launcher)
    url = (run_dir / "store" / "url").read_text().strip()
    # the data is behind the token; the page without it is the login form
    assert httpx.get(f"{url}/v1/dashboard", timeout=10).status_code == 401
    assert httpx.get(f"{url}/v1/dashboard", timeout=10,
                     cookies={"astraflow_session": "forged"}).status_code == 401
    assert 'id="token"' in httpx.get(f"{url}/dashboard", timeout=10).text

    wait = WebDriverWait(browser, 120, poll_frequency=0.25,
                         ignored_exceptions=(StaleElementReferenceException,))
    browser.get(f"{url}/dashboard")
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.ID, "login").click()
    wait.until(lambda d: "not the run's token" in d.page_source)
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()

    # both policies of the run, each with its own card
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "article[data-policy]")) == 2)
    names = browser.execute_script(
        "return [...document.querySelectorAll('article[data-policy]')]"
        ".map(e => e.dataset.policy)")
    assert set(names) == {"solver", "verifier"}

    def cells() -> list[tuple[int, str, str]]:
        """The solver's refresh cells as (version, tooltip, text), read in one go: the
        page redraws itself every two seconds."""
        return [(int(v), title, text) for v, title, text in browser.execute_script(
            "return [...document.querySelectorAll("
            "'table[data-timeline=solver] td.cell[data-version]')]"
            ".map(c => [c.dataset.version, c.title, c.textContent])")]

    # a node joins from outside the launcher: its row appears while the run goes on
    joined.append(join(run_dir, "late-node"))
    late = 'tr[data-node="raas-late-node"]'  # a node's id: its kind, then its name
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, late))
    row = browser.execute_script(f"return document.querySelector('{late}').textContent")
    assert "late" in row and "elsewhere" in row and "active" in row

    # a version published from now on shows in the refresh timeline as it reaches a
    # node, with the time it took
    seen = max((version for version, _, _ in cells()), default=-1)
    wait.until(lambda d: any(version > seen + 1 for version, _, _ in cells()))
    _, title, text = next(c for c in cells() if c[0] > seen + 1)
    assert "after publication" in title
    assert float(text) >= 0.0

    # the evaluator's held-out scores draw the solver's accuracy chart (eval_every=10)
    def accuracy_chart(d) -> str:
        return d.execute_script(
            "const h = [...document.querySelectorAll('article[data-policy=solver] h3')]"
            ".find(e => e.textContent.startsWith('held-out accuracy'));"
            "return h ? h.parentElement.innerHTML : ''")

    wait.until(lambda d: "<svg" in accuracy_chart(d))
    assert "no data yet" not in accuracy_chart(browser)
