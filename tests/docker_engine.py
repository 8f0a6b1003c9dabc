"""The Docker engine tests run containers on: the one running here, or one started for the tests
(`deploy/stack/engine.py`), with the images they need built here with no registry
(`deploy/stack/images.py`). Whatever was started is stopped again."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def deploy_module(name: str):
    """`deploy/stack/<name>.py`, imported (deploy/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"rollwire_stack_{name}", REPO / "deploy/stack" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@contextmanager
def engine_with_images(names: list[str], purpose: str) -> Iterator[None]:
    """A running engine holding the images `names` (built where missing); fails the test with the fix
    when no engine can run here."""
    engine_module = deploy_module("engine")
    if PREBUILD is not None:
        PREBUILD.wait_for(names)
    try:
        engine = engine_module.ensure()  # the session's, when it started one: never stopped here
    except engine_module.EngineError as exc:
        pytest.fail(f"{purpose} needs a Docker engine: {exc}", pytrace=False)
    try:
        images = deploy_module("images")
        try:
            images.build(names)
        except images.BuildError as exc:
            pytest.fail(f"building the images for {purpose} failed: {exc}", pytrace=False)
        yield
    finally:
        engine_module.stop(engine)


class Prebuild:
    """Every image the session's docker tests need, built in the background from the start of the
    session, at low priority, while the other tiers run: the builds are mostly downloads and a Go
    compile that would otherwise hold the suite for ~11 minutes on a fresh machine. The builder and
    the engine are niced (the builds' RUN steps are the engine's children; the docker tests run
    late, after the builds, `tests/lanes.py` LANES). The engine is kept for the session. Phases
    go in the order the tests need them: the container runtime test's base images first."""

    PHASES = (("debian", "python"), ("kafka", "s3", "jaeger", "rollwire"))
    NICE = 10

    def __init__(self, names: set[str]) -> None:
        self.engine_module = deploy_module("engine")
        self.engine = None
        self.error: str | None = None
        self.done: set[str] = set()
        self.log = REPO / ".cache" / "stack" / "prebuild.log"
        self.phases = [[n for n in phase if n in names] for phase in self.PHASES]
        self._finished = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._build, name="image-prebuild", daemon=True)

    def start(self) -> None:
        try:
            self.engine = self.engine_module.ensure(nice=self.NICE)
        except self.engine_module.EngineError as exc:
            self.error = str(exc)  # reported by the first test that needs the engine
            self._finished.set()
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def _build(self) -> None:
        with open(self.log, "ab") as out:
            for phase in self.phases:
                if not phase:
                    continue
                command = ["nice", "-n", str(self.NICE), sys.executable, str(REPO / "deploy/stack/images.py")]
                command += [arg for name in phase for arg in ("--only", name)]
                self._proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
                if self._proc.wait() != 0:
                    self.error = f"`{' '.join(command[3:])}` failed; see {self.log}"
                    break
                self.done.update(phase)
        self._finished.set()

    def wait_for(self, names: list[str], timeout_s: float = 3600.0) -> None:
        """Until the images `names` are built (or the build failed: the caller builds what is missing
        and reports its error)."""
        deadline = time.monotonic() + timeout_s
        while not set(names) <= self.done and not self._finished.is_set() and time.monotonic() < deadline:
            time.sleep(2)

    def stop(self) -> None:
        """At the session's end: a build still going (its tests deselected or failed early) is ended."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
        self._finished.wait(timeout=30)
        if self.engine is not None:
            self.engine_module.stop(self.engine)


STACK_IMAGES = ["debian", "python", "kafka", "s3", "jaeger", "rollwire"]
IMAGES_BY_PATH = {"tests/stack/": STACK_IMAGES, "tests/inference/test_container_runtime.py": ["debian", "python"],
                  "tests/run/test_mixed_run.py": ["debian", "python"]}
"""The images the docker tests under each path need: the prebuild reads this from the tests' ids,
which is all a pytest-xdist controller sees of them (`tests/conftest.py` checks that every test
marked `stack` or `container` is under one of these paths)."""


def images_for(nodeids) -> set[str]:
    return {name for nodeid in nodeids for path, names in IMAGES_BY_PATH.items() if nodeid.startswith(path)
            for name in names}


PREBUILD: Prebuild | None = None
"""The session's background build, when its tests need images (started by `tests/conftest.py`)."""


def start_prebuild(names: set[str]) -> None:
    global PREBUILD
    if names and PREBUILD is None:
        PREBUILD = Prebuild(names)
        PREBUILD.start()
