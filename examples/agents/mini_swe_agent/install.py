"""Installs mini-swe-agent and the packages it runs with into one folder, to be mounted read-only
into rollout containers (`[env_workers.container] mounts`) and put on their `sys.path` by `agent.py`.

    python examples/agents/mini_swe_agent/install.py [--into DIR]   # prints the folder

The packages are built for the containers' Python (3.11, as `local/python:3.11` has), installed
once (a stamp names the versions), with uv where the Makefile put it beside this interpreter.
Only what the agent's Python API needs is installed (`agent.py` uses `DefaultAgent`,
`LocalEnvironment` and `LitellmModel`): mini-swe-agent's command line, its dataset and batch
tools and their dependencies (textual, datasets) stay out. Standard library only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_TARGET = REPO / ".cache" / "agents" / "mini-swe-agent"
MINI_SWE_AGENT = "mini-swe-agent==2.4.6"
RUNTIME = ["litellm==1.110.2", "python-dotenv", "platformdirs", "rich", "jinja2", "pydantic>=2", "tenacity", "pyyaml",
           "requests"]
"""mini-swe-agent's own requirements that its agent, local environment and litellm model import."""
PYTHON = "3.11"


def install(target: Path = DEFAULT_TARGET) -> Path:
    """The folder holding mini-swe-agent and its runtime packages (installed once)."""
    stamp = target / f".installed-{MINI_SWE_AGENT}-{'-'.join(RUNTIME[:1])}"
    if stamp.exists():
        return target
    started = time.monotonic()
    print(f"installing {MINI_SWE_AGENT} into {target} (once) ...", file=sys.stderr, flush=True)
    uv = Path(sys.executable).parent / "uv"
    base = ([str(uv), "pip", "install", "-q", "--python", PYTHON, "--target", str(target)] if uv.exists()
            else [sys.executable, "-m", "pip", "install", "-q", "--python-version", PYTHON, "--only-binary=:all:",
                  "--target", str(target)])
    for packages in ([MINI_SWE_AGENT, "--no-deps"], RUNTIME):
        done = subprocess.run([*base, *packages], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"installing {' '.join(packages)} failed:\n{done.stderr[-2000:]}")
    stamp.touch()
    print(f"installed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--into", type=Path, default=DEFAULT_TARGET, help="the folder (default: %(default)s)")
    print(install(parser.parse_args().into))
