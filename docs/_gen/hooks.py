"""MkDocs hooks of the documentation site.

The design's folders are subpackages of `rollwire` only as `pyproject.toml`'s `package-dir` maps
them (`core/` is `rollwire.core`), which static analysis cannot follow; mkdocstrings reads the
source from a tree of links laid out as the installed package is (`.cache/docs-src/rollwire`),
the same tree `make lint` gives mypy.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / ".cache" / "docs-src" / "rollwire"
MAPPED = ("core", "schemas", "producers", "streams", "consumers", "trainer")


def source_tree() -> Path:
    """`.cache/docs-src`, holding `rollwire/` as the installed package lays it out."""
    TREE.mkdir(parents=True, exist_ok=True)
    for child in (REPO / "rollwire").iterdir():
        _link(TREE / child.name, child)
    for folder in MAPPED:
        _link(TREE / folder, REPO / folder)
    return TREE.parent


def _link(at: Path, to: Path) -> None:
    if at.is_symlink() and at.resolve() == to.resolve():
        return
    if at.is_symlink() or at.exists():
        at.unlink()
    at.symlink_to(to)


def on_startup(command: str, dirty: bool) -> None:
    source_tree()
