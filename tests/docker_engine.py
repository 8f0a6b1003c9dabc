"""The Docker engine tests run containers on: the one running here, or one started for the tests
(`deploy/stack/engine.py`), with the images they need built here with no registry
(`deploy/stack/images.py`). Whatever was started is stopped again."""

from __future__ import annotations

import importlib.util
import sys
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
    try:
        engine = engine_module.ensure()
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
