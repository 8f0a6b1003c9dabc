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
from pathlib import Path

import pytest
from doc_blocks import shell_blocks, site_pages
from user_runs import DEMO_STEPS, metrics_rows

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *(p for p in site_pages(REPO) if "notes" not in p.relative_to(REPO / "docs").parts)]
"""What a reader follows, in the documentation site's order. `docs/notes/` holds the engineers'
measured notes on the machines (installing a broker, an engine), not commands for a rollwire user."""
BLOCKS = [block for path in DOCUMENTS for block in shell_blocks(path)]
TOOLS = ("jq", "curl")
"""Tools the blocks use besides rollwire and Python (`.ci/run` installs them where missing)."""


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
