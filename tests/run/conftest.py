"""One run of the bundled demo for the whole session, as the README's `make run` starts it, in a
workspace laid out as the README's commands expect (`runs/demo`, `examples/`). The tests that only
read a demo run's outcome share it: whether it learned (`test_run.py`), and the README's own
command blocks run on it (`test_readme.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from user_runs import finish, start_run

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoRun:
    workspace: Path
    """A folder laid out as the README's commands expect: `runs/demo` (this run), `examples/`."""
    returncode: int
    output: str

    @property
    def run_dir(self) -> Path:
        return self.workspace / "runs" / "demo"


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """`rollwire run` with the bundled demo recipe (what `make run` runs), unchanged but for where it writes."""
    workspace = tmp_path_factory.mktemp("readme")
    (workspace / "examples").symlink_to(REPO / "examples")
    done = start_run("--run-dir", str(workspace / "runs" / "demo"))
    output = finish(done, 1500)
    yield DemoRun(workspace=workspace, returncode=done.returncode, output=output)
