"""`rollwire env`: environments people bring (list, init, check)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rollwire.cli.evaluate import parse_options
from rollwire.producers.tool_calls import TOOL_CALL_FORMATS

EPILOG = """\
A taskset is found by its name among those bundled with rollwire and those installed packages
declare (entry-point group `rollwire.environments`), or by a reference: `package.module:Class`,
`path/to/file.py:Class`, or `path/to/file.py` when the file defines one taskset.

examples:
  rollwire env list
  rollwire env init sorting                        write ./sorting, a package: pip install -e sorting
  rollwire env check sorting --base-url http://127.0.0.1:8000/v1 --model policy
  rollwire env check envs/sorting.py:Sorting --run-dir runs/demo     against a running run's replica
"""


def add_env(sub) -> None:
    env = sub.add_parser("env", help="environments you bring: list, init a package, check one against a model",
                         description="Environments you bring: your own tasksets, rewards and metrics, in a package "
                                     "of your own or a file.", epilog=EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = env.add_subparsers(dest="env_command", metavar="COMMAND", required=True)

    listing = commands.add_parser("list", help="the tasksets this environment can load, and where each comes from")
    listing.set_defaults(run=cmd_list)

    init = commands.add_parser(
        "init", help="write a package holding a new environment",
        description="Writes a package (pyproject with the entry point, a taskset, a reward, a test, a README) that "
                    "`pip install -e` makes loadable by name in recipes and commands.",
        epilog="example:\n  rollwire env init sorting && pip install -e sorting && rollwire env list",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    init.add_argument("name", help="the environment's name: lowercase letters, digits, dashes (e.g. sorting)")
    init.add_argument("--dir", type=Path, help="where to write it (default: ./NAME)")
    init.set_defaults(run=cmd_init)

    check = commands.add_parser(
        "check", help="load an environment and run a few rollouts against a model",
        description="Loads the environment (checking its options), runs a few rollouts against an OpenAI-compatible "
                    "endpoint or a running run's first replica, and prints each rollout's rewards and metrics.",
        epilog="examples:\n  rollwire env check sorting --base-url http://127.0.0.1:8000/v1 --model policy\n"
               "  rollwire env check reverse-digits --run-dir runs/demo -n 8",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("name", help="a taskset name, or a reference (package.module:Class, file.py[:Class])")
    check.add_argument("--base-url", help="OpenAI-compatible base URL, ending in /v1")
    check.add_argument("--model", help="the model name the endpoint serves")
    check.add_argument("--run-dir", type=Path, help="a running run's directory: its first replica is the endpoint")
    check.add_argument("-n", "--limit", type=int, default=4, help="rollouts (default: %(default)s)")
    check.add_argument("--temperature", type=float, default=1.0, help="(default: %(default)s)")
    check.add_argument("--max-tokens", type=int, default=64, help="(default: %(default)s)")
    check.add_argument("--tool-call-format", choices=TOOL_CALL_FORMATS, default="hermes",
                       help="the format the model writes tool calls in (default: %(default)s)")
    check.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="taskset option, e.g. seed=3 (repeatable)")
    check.set_defaults(run=cmd_check)


def cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from rollwire.producers.tasksets import TASKSETS
    table = Table(title="tasksets")
    for column in ("name", "harness", "from", "class"):
        table.add_column(column)
    for name in TASKSETS.names():
        cls = TASKSETS.get(name)
        origin = "rollwire" if cls.__module__.startswith("rollwire.") else cls.__module__.split(".")[0]
        table.add_row(name, cls.harness, origin, f"{cls.__module__}:{cls.__qualname__}")
    Console().print(table)
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from rollwire.producers.env_package import write_package
    folder = args.dir or Path(args.name)
    for path in write_package(args.name, folder):
        print(f"wrote {path}")
    print(f"\nnext:\n  pip install -e {folder}\n  (cd {folder} && pytest)\n"
          f"  rollwire env check {args.name} --base-url http://127.0.0.1:8000/v1 --model policy")
    return 0


def _endpoint(args: argparse.Namespace) -> tuple[str, str]:
    if args.run_dir is not None:
        from rollwire.run.recipe import RunRecipe
        recipe_path = args.run_dir / "recipe.json"
        if not recipe_path.is_file():
            raise SystemExit(f"rollwire env check: {args.run_dir} holds no recipe.json: give the directory of a run")
        server = RunRecipe.model_validate_json(recipe_path.read_text()).server_settings()
        if not server.port:
            raise SystemExit(f"rollwire env check: {args.run_dir}'s recipe names no replica port: is the run started?")
        return f"http://{server.host}:{server.port}/v1", server.served_model_name
    if not (args.base_url and args.model):
        raise SystemExit("rollwire env check: give --base-url and --model, or --run-dir of a running run")
    return args.base_url, args.model


def cmd_check(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from rollwire.core.endpoints import OpenAIEndpoint
    from rollwire.producers.evaluate import evaluate, summary
    from rollwire.producers.tasksets import load_taskset
    taskset = load_taskset(args.name, **parse_options(args.option, "rollwire env check"))
    base_url, model = _endpoint(args)
    endpoint = OpenAIEndpoint(base_url, model, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"))
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(f"{args.name} on {model}", total=args.limit)
        results = evaluate(taskset, endpoint, limit=args.limit, temperature=args.temperature,
                           max_tokens=args.max_tokens, concurrency=4, on_result=lambda _: progress.advance(task),
                           tool_call_format=args.tool_call_format)
    names = list(dict.fromkeys(n for r in results for n in [*r.rewards, *r.metrics]))
    table = Table(title=f"{args.name} ({type(taskset).__module__}:{type(taskset).__qualname__}) on {model}")
    for column in ("task", "completion", "reward", *names, "error"):
        table.add_column(column, overflow="fold")
    for r in results:
        values = {**r.rewards, **r.metrics}
        table.add_row(r.task_id, repr(r.completion[:60]), f"{r.reward:.3f}",
                      *(f"{values[n]:.3f}" if n in values else "—" for n in names), r.error or "")
    Console().print(table)
    print(json.dumps({"environment": args.name, "model": model, "rollouts": len(results), **summary(results)}))
    return 1 if results and all(r.error for r in results) else 0
