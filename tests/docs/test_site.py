"""The documentation site builds in strict mode (a broken link, a missing anchor or a page left out
of the navigation fails it), its reference pages are generated from the code, and the README stays
a front page. The site's shell blocks run in `tests/run/test_demo.py`, on the demo run."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollwire.cli import build_parser
from rollwire.run.recipe import RunRecipe
from rollwire.schemas import CATALOG

REPO = Path(__file__).resolve().parents[2]
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
"""MkDocs' and Material's banners about their future, printed on every build."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                          env={**os.environ, **QUIET}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    assert "WARNING" not in done.stderr, done.stderr[-8000:]
    return out


def _page(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


def _commands(parser: argparse.ArgumentParser, prefix: str = "rollwire") -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [f"{prefix} {name}", *_commands(sub, f"{prefix} {name}")]
    return found


def test_every_command_has_its_help_on_the_commands_page(site):
    page = _page(site, "reference/commands")
    missing = [c for c in _commands(build_parser()) if f"usage: {c}" not in page.replace("\n", " ")]
    assert not missing, missing
    assert len(_commands(build_parser())) > 20


def test_every_recipe_setting_is_on_the_settings_page(site):
    page = _page(site, "reference/settings")
    for name in RunRecipe.model_fields:
        assert f"{name}" in page, name
    for setting in ("max_off_policy", "dedupe_window", "max_closed_groups", "max_receipts", "outage_s"):
        assert f"<code>{setting}</code>" in page, setting


def test_every_topic_and_event_is_on_the_topics_page(site):
    page = _page(site, "reference/topics")
    for spec in CATALOG:
        assert f"rollwire.{spec.name}" in page, spec.name
        for event in spec.events:
            assert event.model_fields["type"].default in page


def test_the_api_page_renders_docstrings(site):
    page = _page(site, "reference/api")
    assert "RecentKeys" in page and "The last <code>limit</code> keys added" in page
    assert "Taskset" in page


def test_the_readme_is_a_front_page_and_the_site_home():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md is the front page: move detail into docs/"
    assert "make run" in readme and "make test" in readme


def test_the_home_page_is_the_readme_with_working_links(site):
    home = _page(site, "")
    assert "How it compares" in home and 'href="getting-started/"' in home


def _nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_of_the_navigation_can_be_written_without_mkdocs(tmp_path):
    """MkDocs 1.x is unmaintained and Material reaches its end of life in May 2027: the generated
    pages are a plain script's output too, so a builder that runs no MkDocs plugin (Zensical, which
    reads this mkdocs.yml) gets the whole site (docs/development.md)."""
    spec = importlib.util.spec_from_file_location("site_pages", REPO / "docs" / "_gen" / "pages.py")
    pages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pages)
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    written = pages.write_pages(docs)
    assert {p.relative_to(docs).as_posix() for p in written} == set(pages.PAGES)
    nav = _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    missing = [page for page in nav if not (docs / page).is_file()]
    assert not missing, missing
    assert "usage: rollwire run" in (docs / "reference" / "commands.md").read_text()
