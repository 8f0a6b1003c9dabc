"""The documentation site's generated pages, written at build time from the code (mkdocs-gen-files),
so they cannot drift from it:

    reference/commands.md   every `rollwire` command's --help, from the parser itself
    reference/settings.md   every recipe setting: its table, default and docstring, from the models
    reference/topics.md     the topic catalog and every event's fields, from `schemas/`
    benchmarks/results.md   bench/RESULTS.md as recorded
    index.md                the README, its links made relative to the site

Run by `mkdocs build` (`make docs`) through mkdocs-gen-files; `python docs/_gen/pages.py DOCS` writes
them into a copy of `docs/` for a builder that runs no MkDocs plugin (Zensical: docs/development.md).
`tests/docs/test_site.py` builds the site in strict mode.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parents[2]


# -- commands --------------------------------------------------------------------------------------

def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((name, sub))
                found += [(f"{name} {child}", grand) for child, grand in _subcommands(sub)]
    return found


def commands_page() -> str:
    from rollwire.cli import build_parser

    parser = build_parser()
    lines = ["# Commands", "",
             "Every `rollwire` command with its `--help`, generated from the command's parser. "
             "`rollwire COMMAND --help` prints the same.", "", "## rollwire", "", "```text",
             parser.format_help().rstrip(), "```", ""]
    for name, sub in _subcommands(parser):
        lines += [f"## rollwire {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


# -- settings --------------------------------------------------------------------------------------

def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings models an annotation holds (a model, an optional one, a union of variants, a list of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _type_name(annotation: Any) -> str:
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = re.sub(r"\b(typing|pathlib|rollwire\.[\w.]+)\.", "", text)
    return text.replace("NoneType", "None").replace("|", "\\|")


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(table below)"
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    text = repr(value) if not isinstance(value, Path) else repr(str(value))
    return f"`{text}`".replace("|", "\\|") if len(text) < 60 else f"`{text[:57]}...`"


def _doc(info: FieldInfo) -> str:
    return " ".join((info.description or "").split()).replace("|", "\\|")


def _variant(model: type[BaseModel]) -> str:
    tag = model.model_fields.get("type")
    return f" (`type = \"{tag.default}\"`)" if tag is not None and isinstance(tag.default, str) else ""


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list or any(_is_list(a) for a in typing.get_args(annotation))


def _section(model: type[BaseModel], path: list[str], lines: list[str], seen: set[tuple[str, type]],
             many: bool = False) -> None:
    key = (".".join(path), model)
    if key in seen:
        return
    seen.add(key)
    rows, nested = [], []
    for name, info in model.model_fields.items():
        inner = _models_in(info.annotation)
        if inner:
            nested.append((name, info, inner))
        else:
            rows.append(f"| `{name}` | {_type_name(info.annotation)} | {_default(info)} | {_doc(info)} |")
    if path and rows:
        title = f"[[{'.'.join(path)}]]" if many else f"[{'.'.join(path)}]"
        about = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
        lines += [f"### `{title}`{_variant(model)}", "", about, "",
                  "| setting | type | default | what it does |", "|---|---|---|---|", *rows, ""]
    for name, info, inner in nested:
        for sub in inner:
            _section(sub, [*path, name], lines, seen, many=_is_list(info.annotation))


def settings_page() -> str:
    from rollwire.run.recipe import RunRecipe

    lines = ["# Recipe settings", "",
             "Every table and setting of a `rollwire run` recipe, generated from the components' own "
             "settings models: the defaults and docstrings here are the code's. "
             "`rollwire run --print-recipe` prints a whole recipe with its values. Where a table has "
             "variants (the event log, the object store), each is listed with its `type`.", "",
             "## Top level", "", "| setting | type | default | what it does |", "|---|---|---|---|"]
    for name, info in RunRecipe.model_fields.items():
        if not _models_in(info.annotation):
            lines.append(f"| `{name}` | {_type_name(info.annotation)} | {_default(info)} | {_doc(info)} |")
    lines += ["", "## Tables", ""]
    _section(RunRecipe, [], lines, set())
    return "\n".join(lines)


# -- topics ----------------------------------------------------------------------------------------

def topics_page() -> str:
    from rollwire.schemas import CATALOG
    from rollwire.schemas.topics import markdown_table

    lines = ["# Topics and events", "",
             "Generated from the topic catalog (`schemas/topics.py`) and the event models (`schemas/`); "
             "`rollwire topics` prints the same table. Names take the run's prefix.", "",
             markdown_table(), "", "## Events", ""]
    for spec in CATALOG:
        for event in spec.events:
            tag = event.model_fields["type"].default
            lines += [f"### `{tag}`", "", f"On `{spec.name}`. " + " ".join((event.__doc__ or "").split()), "",
                      "| field | type | what it holds |", "|---|---|---|"]
            for name, info in event.model_fields.items():
                if name in ("type",):
                    continue
                lines.append(f"| `{name}` | {_type_name(info.annotation)} | {_doc(info)} |")
            lines.append("")
    return "\n".join(lines)


# -- copies ----------------------------------------------------------------------------------------

def index_page() -> str:
    """The README as the site's front page: links into `docs/` made relative to the site."""
    text = (REPO / "README.md").read_text()
    return re.sub(r"\]\(docs/", "](", text)


def results_page() -> str:
    text = (REPO / "bench" / "RESULTS.md").read_text()
    return re.sub(r"^# .*\n", "# Benchmark results\n\nAs recorded in `bench/RESULTS.md`, newest sections "
                  "where each benchmark's history ends; each names the command that produced it.\n", text, count=1)


PAGES = {"reference/commands.md": commands_page, "reference/settings.md": settings_page,
         "reference/topics.md": topics_page, "index.md": index_page, "benchmarks/results.md": results_page}
"""Each generated page by its path in the site, and what writes it."""


def write_pages(docs: Path) -> list[Path]:
    """Writes the generated pages into a copy of `docs/`, for a builder without mkdocs-gen-files
    (Zensical, Material's successor, runs no MkDocs plugin)."""
    written = []
    for page, text in PAGES.items():
        (docs / page).parent.mkdir(parents=True, exist_ok=True)
        (docs / page).write_text(text())
        written.append(docs / page)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Writes the site's generated pages into DOCS, a copy of docs/ "
                                     "(`mkdocs build` writes them itself, through mkdocs-gen-files).")
    parser.add_argument("docs", type=Path, help="the copy of docs/ to write them into")
    for path in write_pages(parser.parse_args().docs):
        print(path)
elif __name__ == "<run_path>":  # mkdocs-gen-files runs this file (runpy.run_path) during `mkdocs build`
    import mkdocs_gen_files

    for page, text in PAGES.items():
        with mkdocs_gen_files.open(page, "w") as out:
            out.write(text())
