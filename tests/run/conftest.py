"""One run of the bundled demo for the whole session, as the README's `make run` starts it but 60
steps long, in a workspace laid out as the README's commands expect (`runs/demo`, `examples/`).
The tests that only read a demo run's outcome share it (`test_demo.py`): whether it learned, and
the README's own command blocks run on it, which name only steps and versions
that a 60-step demo and the full 150-step one both keep (the demo's retention keeps every 25th).

60 steps prove the same as 150 here: the mean reward of the last 10 steps is far above that of
the first 10 (0.44 -> 0.95 at step 60, 1.11 at step 150, in one run of 2026-12-03); the full
demo's curve is the README's, measured with `make run`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from user_runs import DEMO_STEPS, finish, start_run

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoRun:
    workspace: Path
    """A folder laid out as the docs' commands expect: `runs/demo` (this run), `examples/`, `.venv`."""
    returncode: int
    output: str

    @property
    def run_dir(self) -> Path:
        return self.workspace / "runs" / "demo"


@dataclass(frozen=True)
class DemoStarted:
    """The demo run while it goes: for the tests that watch it live (they run before `demo_run`'s)."""

    workspace: Path
    process: subprocess.Popen

    @property
    def run_dir(self) -> Path:
        return self.workspace / "runs" / "demo"


@pytest.fixture(scope="session")
def demo_started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStarted]:
    """`rollwire run --steps 60` with the bundled demo recipe (what `make run` runs) started, writing to the workspace."""
    workspace = tmp_path_factory.mktemp("readme")
    (workspace / "examples").symlink_to(REPO / "examples")
    (workspace / ".venv").symlink_to(Path(sys.executable).parent.parent)  # `source .venv/bin/activate` (getting started)
    process = start_run("--run-dir", str(workspace / "runs" / "demo"), "--steps", str(DEMO_STEPS))
    try:
        yield DemoStarted(workspace, process)
    finally:
        if process.poll() is None:  # no test waited for its end (`demo_run`): stopped as Ctrl-C would
            finish(process, 60)


@pytest.fixture(scope="session")
def demo_run(demo_started: DemoStarted) -> Iterator[DemoRun]:
    """The demo run, ended."""
    output = finish(demo_started.process, 1500)
    yield DemoRun(workspace=demo_started.workspace, returncode=demo_started.process.returncode, output=output)
