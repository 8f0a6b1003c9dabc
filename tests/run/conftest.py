"""One run of the bundled demo for the whole session, as the README's `make run` starts it but 60
steps long, in a workspace laid out as the README's commands expect (`runs/demo`, `examples/`).
The tests that only read a demo run's outcome share it (`test_demo.py`): whether it learned, and
the README's own command blocks run on it, which name only steps and versions
that a 60-step demo and the full 150-step one both keep (the demo's retention keeps every 25th).

60 steps prove the same as 150 here: the mean reward of the last 10 steps is far above that of
the first 10 (0.44 -> 0.95 at step 60, 1.11 at step 150, in one run of 2026-12-03); the full
demo's curve is the README's, measured with `make run`."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """`rollwire run --steps 60` with the bundled demo recipe (what `make run` runs), writing to the workspace."""
    workspace = tmp_path_factory.mktemp("readme")
    (workspace / "examples").symlink_to(REPO / "examples")
    (workspace / ".venv").symlink_to(Path(sys.executable).parent.parent)  # `source .venv/bin/activate` (getting started)
    done = start_run("--run-dir", str(workspace / "runs" / "demo"), "--steps", str(DEMO_STEPS))
    output = finish(done, 1500)
    yield DemoRun(workspace=workspace, returncode=done.returncode, output=output)
