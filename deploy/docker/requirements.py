"""Print the third-party requirements of rollwire's extras, one a line, for an image layer that
installs them before the source is copied (so a code change does not reinstall torch).

    python requirements.py streams,serve > streams.txt     # the core dependencies and those extras'

Extras that name rollwire's own extras (`rollwire[kafka]`) are expanded.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SELF = re.compile(r"^rollwire\[(?P<extras>[^\]]+)\]$")


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    optional = project["optional-dependencies"]
    found: list[str] = list(project["dependencies"])
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"no extra {extra!r} in pyproject.toml (there are: {', '.join(optional)})")
        seen.add(extra)
        for requirement in optional[extra]:
            match = SELF.match(requirement.replace(" ", ""))
            if match:
                pending.extend(match["extras"].split(","))
            elif requirement not in found:
                found.append(requirement)
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit("usage: requirements.py EXTRA[,EXTRA...]  (reads pyproject.toml beside it or in /tmp/build)")
    here = Path(__file__).resolve().parent
    for candidate in (here / "pyproject.toml", here.parents[1] / "pyproject.toml"):
        if candidate.exists():
            pyproject = tomllib.loads(candidate.read_text())
            break
    else:
        raise SystemExit("pyproject.toml not found beside requirements.py or two folders up")
    print("\n".join(requirements(pyproject, [e for e in argv[1].split(",") if e])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
