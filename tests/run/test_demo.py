"""The demo run (what `make run` runs, 60 steps long, once for the session: `conftest.py`): it
learns, and the command blocks of the README and the documentation site run on it as a reader runs
them: in a shell, in a folder whose `runs/demo` is that run, in the order the site gives them. A block that cannot run here
says why in a marker above it (`tests/doc_blocks.py`); this module lists those reasons in CI's
output and fails a block with neither. Every test of the demo run is in this file, so that one
test worker runs them all and the demo is run once (`make test` shares files among workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doc_blocks import shell_blocks, site_pages
from explorer import browser, explorer, open_rollout, open_view, points, screenshot, wait_for
from user_runs import DEMO_STEPS, metrics_rows

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *(p for p in site_pages(REPO) if "notes" not in p.relative_to(REPO / "docs").parts)]
"""What a reader follows, in the documentation site's order. `docs/notes/` holds the engineers'
measured notes on the machines (installing a broker, an engine), not commands for a rollwire user."""
BLOCKS = [block for path in DOCUMENTS for block in shell_blocks(path)]
CLICK_FIRST = """const el = document.querySelector(arguments[0]); if (!el) return null; el.click();
                 return el.dataset.step || el.dataset.name || el.dataset.id;"""
"""Finds and clicks inside the page in one step: the views redraw their tables as the run goes."""
TOOLS = ("jq", "curl")
"""Tools the blocks use besides rollwire and Python (`.ci/run` installs them where missing)."""


def test_the_explorer_page_follows_the_demo_while_it_trains(demo_started):
    """Runs first: the demo is still going. The reward curve of `rollwire explore`'s page grows."""
    train = demo_started.run_dir / "log" / "topics" / "demo.train.sqlite"
    deadline = time.monotonic() + 600
    while not train.exists():  # the run's log holds its topics once the warm start is done
        assert demo_started.process.poll() is None and time.monotonic() < deadline, "the demo made no log"
        time.sleep(1)
    with explorer("--run-dir", str(demo_started.run_dir)) as url, browser() as driver:
        driver.get(url)
        wait_for(driver, lambda d: points(d, "chart-reward") >= 1, 600, "the demo's first step on the reward curve")
        first = points(driver, "chart-reward")
        assert first < DEMO_STEPS, "the demo ended before the page could watch it"
        wait_for(driver, lambda d: points(d, "chart-reward") >= first + 3, 300, "three more steps on the reward curve")
        assert driver.find_element("id", "run-state").text == "● live"


def test_demo_learns(demo_run, capsys):
    """The README's run command, 60 steps long (run once for the session, `conftest.py`)."""
    assert demo_run.returncode == 0, demo_run.output
    rows = metrics_rows(demo_run.run_dir / "metrics.jsonl")
    first10 = sum(r["reward_mean"] for r in rows[:10]) / 10
    last10 = sum(r["reward_mean"] for r in rows[-10:]) / 10
    minutes = (rows[-1]["time_ms"] - rows[0]["time_ms"]) / 60_000
    with capsys.disabled():  # in CI's output, whatever the verdict
        print(f"\ndemo: {len(rows)} steps, mean reward first 10 {first10:.3f}, last 10 {last10:.3f}; "
              f"{minutes:.1f} min from the first step to the last")
    assert len(rows) == DEMO_STEPS
    assert last10 > first10 + 0.3, (first10, last10)  # measured: 0.44 -> 0.95 at step 60 (conftest.py)


def test_every_shell_block_runs_or_says_why_not(capsys):
    not_run = [b for b in BLOCKS if b.not_run is not None]
    assert all(b.not_run.strip() for b in not_run), [b.name for b in not_run if not b.not_run.strip()]
    assert len(BLOCKS) - len(not_run) >= 5, "the docs' replay, inspect, feedback and promote blocks must run"
    with capsys.disabled():
        print("\ndocumentation blocks not run here: " + "; ".join(f"{b.name} ({b.not_run})" for b in not_run))


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.not_run is None], ids=lambda b: b.name)
def test_the_block_runs_on_the_demo_run(block, demo_run):
    assert demo_run.returncode == 0, demo_run.output[-3000:]
    missing = [tool for tool in TOOLS if not _on_path(tool)]
    assert not missing, f"the README's blocks use {missing}: `apt-get install {' '.join(missing)}`"
    bin_dir = str(Path(sys.executable).parent)  # `rollwire` and `python` as the environment installs them
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    shell = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block.script()], cwd=demo_run.workspace, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output = shell.communicate(timeout=900)[0]
    finally:
        _end_group(shell)  # a server the block left in the background goes with it
    assert shell.returncode == 0, f"{block.name} exited {shell.returncode}:\n{block.script()}\n{output[-6000:]}"
    assert "Traceback" not in output, output[-6000:]
    if "rollwire replay train" in block.script():
        assert "replayed loss" in output, output[-6000:]  # the report's table, printed


def test_the_explorer_page_tells_the_finished_demos_story(demo_run):
    """After the run: every step on the curves, a rollout's tokens with the versions that sampled
    them, the steps with the replicas that served them, the fleet; screenshots for the docs."""
    with explorer("--run-dir", str(demo_run.run_dir)) as url, browser() as driver:
        driver.get(url)
        wait_for(driver, lambda d: points(d, "chart-reward") == DEMO_STEPS, 120, f"all {DEMO_STEPS} steps on the curve")
        assert points(driver, "chart-staleness") == DEMO_STEPS
        wait_for(driver, lambda d: not d.find_elements("id", "reading"), 120, "the page's index caught up with the log")
        # once caught up, every step has its environment's reward (rollouts read after their step fill it in)
        wait_for(driver, lambda d: points(d, "chart-reward", full=True) == DEMO_STEPS, 10, "every step's reward per environment")
        screenshot(driver, "curves")
        rollout_id = open_rollout(driver, fate="trained")
        tokens = driver.find_elements("css selector", "#tokens span.tok")
        versions = {t.get_attribute("data-version") for t in tokens if t.get_attribute("data-mask") == "1"}
        assert tokens and versions and "" not in versions, (rollout_id, versions)
        assert all(0 <= int(v) <= DEMO_STEPS for v in versions)
        assert "trained in step" in driver.find_element("id", "rollout-fate").text
        assert driver.find_elements("css selector", "#group-table tbody tr")  # its group beside it
        screenshot(driver, "rollout")
        open_view(driver, "steps")
        first_step = wait_for(driver, lambda d: d.execute_script(CLICK_FIRST, "#step-table tbody tr"), 30, "the steps")
        assert first_step == str(DEMO_STEPS)  # newest first
        wait_for(driver, lambda d: f"Step {DEMO_STEPS}" in d.find_element("id", "step-detail").text, 30, "the step's story")
        screenshot(driver, "steps")
        open_view(driver, "fleet")
        wait_for(driver, lambda d: d.find_elements("css selector", "#replica-table tbody tr"), 30, "the fleet")
        screenshot(driver, "fleet")


def test_the_explorer_page_compares_the_demos_replays(demo_run):
    """After the documentation's blocks ran on the demo (they replay it as RLOO and with a fixed reward)."""
    replays = sorted(p.name for p in (demo_run.run_dir / "replays").glob("*") if (p / "report.md").is_file())
    assert replays, "the docs' `rollwire replay score` blocks left no report in runs/demo/replays"
    with explorer("--run-dir", str(demo_run.run_dir)) as url, browser() as driver:
        driver.get(url + "#replays")
        wait_for(driver, lambda d: d.execute_script(CLICK_FIRST, f"#replay-list li[data-name='{replays[0]}']"), 60,
                 f"replay {replays[0]} listed")
        changed = wait_for(driver, lambda d: d.find_element("id", "replay-changed"), 300, "the replay's comparison")
        assert int(changed.text) >= 0
        screenshot(driver, "replays")


def _on_path(tool: str) -> bool:
    return any(os.access(os.path.join(folder, tool), os.X_OK) for folder in os.environ["PATH"].split(os.pathsep))


def _end_group(shell: subprocess.Popen) -> None:
    try:
        os.killpg(shell.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        shell.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
