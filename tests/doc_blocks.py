"""The shell blocks of the README and the docs, as a test runs them (`tests/run/test_demo.py`).

A fenced block whose language is `bash`, `sh`, `shell` or `console` is a command a reader may
copy. A `console` block is a transcript: its commands are the lines that start with `$ `, with
their `\\` continuation lines; the rest is output shown for reading. Every such block either runs
against the shared demo run or says why not in a marker on the line just above its fence:

    <!-- not run by tests: REASON -->

Other blocks (toml, python) are settings and code shown for reading; the recipe tests load the
bundled recipes they come from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHELL = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"^<!--\s*not run by tests:\s*(?P<reason>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")


@dataclass(frozen=True)
class Block:
    """One shell block of a document."""

    path: Path
    line: int
    """The line of its opening fence, from 1."""
    lang: str
    text: str
    not_run: str | None
    """Why a test does not run it (the marker's reason); None: a test runs it."""

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line}"

    def script(self) -> str:
        """What a shell runs for this block: the block itself, or a transcript's commands."""
        if self.lang != "console":
            return self.text
        commands, going_on = [], False
        for line in self.text.splitlines():
            if line.startswith("$ ") or going_on:
                commands.append(line[2:] if line.startswith("$ ") and not going_on else line)
                going_on = line.rstrip().endswith("\\")
        return "\n".join(commands) + "\n"


def shell_blocks(path: Path) -> list[Block]:
    """The shell blocks of the Markdown file `path`, in order."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next((j for j in range(index + 1, len(lines)) if lines[j].startswith(opening["fence"])), len(lines))
        lang = opening["lang"].lower()
        if lang in SHELL:
            marker = MARKER.match(lines[index - 1]) if index > 0 else None
            blocks.append(Block(path=path, line=index + 1, lang=lang, text="\n".join(lines[index + 1:end]) + "\n",
                                not_run=marker["reason"] if marker else None))
        index = end + 1
    return blocks


def site_pages(repo: Path) -> list[Path]:
    """The documentation's pages in the order its site's navigation gives them (`mkdocs.yml`),
    the order a reader follows; pages generated at build time are not files and are left out."""
    import yaml

    config = yaml.safe_load((repo / "mkdocs.yml").read_text())
    docs = repo / config.get("docs_dir", "docs")

    def walk(entries: list) -> list[str]:
        found: list[str] = []
        for entry in entries:
            target = next(iter(entry.values())) if isinstance(entry, dict) else entry
            found += walk(target) if isinstance(target, list) else [target]
        return found

    return [docs / page for page in walk(config["nav"]) if (docs / page).is_file()]
