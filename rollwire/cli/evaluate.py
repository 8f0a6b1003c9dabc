"""`rollwire eval`: an environment against any OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rollwire.producers.tool_calls import TOOL_CALL_FORMATS


def add_evaluate(sub) -> None:
    evaluate = sub.add_parser(
        "eval", help="score an environment against any OpenAI-compatible endpoint",
        description="Runs an environment's rows against an OpenAI-compatible endpoint (a local vLLM server, "
                    "or an API model: no logprobs are needed) and prints the mean of each reward and metric. "
                    "Environments are evals.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  rollwire eval reverse-digits --base-url http://127.0.0.1:8000/v1 --model policy -n 50\n"
               "  rollwire eval math-word --option path=data/gsm8k_test.jsonl --base-url https://api.example/v1 "
               "--model some-model\n"
               "  rollwire eval reverse-digits --run-dir runs/demo --version policy@150 --version demo-fixed@150 -n 200\n"
               "  rollwire eval examples/environments/graded_reversal.py:GradedReversal --recipe examples/mixed.toml "
               "--base-url http://127.0.0.1:8000/v1 --model policy --temperature 1 --seed 7\n\n"
               "Each row runs as the environment's training rollouts run: its harness and options, or its agent "
               "program, in its runtime (a container graded inside, with --recipe or --run-dir naming that "
               "entry), then its rewards. With --seed, sampled answers repeat from one command to the next.")
    evaluate.add_argument("environment", help="a taskset, e.g. reverse-digits or math-word, an installed package's "
                          "(rollwire env list), or a reference: package.module:Class, file.py[:Class]")
    evaluate.add_argument("--base-url", help="OpenAI-compatible base URL, ending in /v1")
    evaluate.add_argument("--model", action="append", default=[],
                          help="model name the endpoint serves (repeat to compare several: a row each)")
    ab = evaluate.add_argument_group("A/B of published weight versions (instead of --base-url)")
    ab.add_argument("--run-dir", type=Path, help="a run's directory: its store, log and inference settings")
    ab.add_argument("--version", action="append", default=[], metavar="POLICY@V",
                    help="a published version, e.g. policy@150 (the run's) or demo-fixed@150 (a replay's); "
                         "repeat: each is loaded into one managed vLLM server in turn, a row each")
    evaluate.add_argument("-n", "--limit", type=int, default=20, help="rows to evaluate (default: %(default)s)")
    evaluate.add_argument("--samples", type=int, default=1, help="answers per row (default: %(default)s)")
    evaluate.add_argument("--temperature", type=float, default=0.0, help="(default: %(default)s)")
    evaluate.add_argument("--max-tokens", type=int, default=256, help="(default: %(default)s)")
    evaluate.add_argument("--concurrency", type=int, default=4, help="requests at once (default: %(default)s)")
    evaluate.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                          help="taskset option, e.g. path=data.jsonl or seed=3 (repeatable)")
    evaluate.add_argument("--seed", type=int, help="sample reproducibly: each call asks the endpoint for a seed "
                          "made from this one, the row and the sample (default: unseeded)")
    evaluate.add_argument("--recipe", type=Path, help="run the rows as this recipe's entry for the environment says "
                          "(harness, options, agent program, runtime, container); --run-dir's recipe otherwise")
    evaluate.add_argument("--harness", help="run the rows with this harness instead of the taskset's (completion, "
                          "chat, package.module:function); with --run-dir, the run's recipe entry's is the default")
    evaluate.add_argument("--harness-option", action="append", default=[], metavar="KEY=VALUE",
                          help="harness option, e.g. max_turns=8 for chat (repeatable)")
    evaluate.add_argument("--tool-call-format", choices=TOOL_CALL_FORMATS,
                          help="the format the model writes tool calls in, for a harness that answers them "
                               "(default: hermes; with --run-dir, read from the served chat template)")
    evaluate.add_argument("--out", type=Path, help="write every scored answer as JSON lines")
    evaluate.set_defaults(run=cmd_eval)


def parse_options(items: list[str], command: str, flag: str = "--option") -> dict:
    """`--option KEY=VALUE` items as options; a VALUE that parses as JSON is that value."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{command}: {flag} {item!r} needs the form KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from rollwire.core.endpoints import OpenAIEndpoint
    from rollwire.producers.evaluate import evaluate, summary
    from rollwire.producers.tasksets import load_taskset
    taskset = load_taskset(args.environment, **parse_options(args.option, "rollwire eval"))
    settings = {"limit": args.limit, "samples": args.samples, "temperature": args.temperature,
                "max_tokens": args.max_tokens, "concurrency": args.concurrency, "setup": _setup(args, taskset),
                "seed": args.seed}
    if args.tool_call_format:
        settings["tool_call_format"] = args.tool_call_format
    console = Console(stderr=True)
    with Progress(console=console, transient=True) as progress:
        def bar(label: str):
            task = progress.add_task(f"{args.environment} on {label}", total=args.limit * args.samples)
            return lambda _: progress.advance(task)

        if args.run_dir is not None:
            rows = _versions(args, taskset, settings, bar)
        elif args.base_url and args.model:
            key = os.environ.get("OPENAI_API_KEY", "EMPTY")
            rows = [(m, evaluate(taskset, OpenAIEndpoint(args.base_url, m, api_key=key), on_result=bar(m), **settings))
                    for m in args.model]
        else:
            raise SystemExit("rollwire eval: give --base-url and --model, or --run-dir and --version POLICY@V")
    if args.out:
        with open(args.out, "w") as out:
            for label, results in rows:
                for r in results:
                    out.write(json.dumps({"model": label, **r.__dict__}) + "\n")
    summaries = [(label, len(results), summary(results)) for label, results in rows]
    names = list(dict.fromkeys(name for _, _, scores in summaries for name in scores))
    table = Table(title=f"{args.environment}: {args.limit * args.samples} answers from each")
    table.add_column("model")
    for name in names:
        table.add_column(name, justify="right")
    for label, _, scores in summaries:
        table.add_row(label, *(f"{scores[n]:.3f}" if n in scores else "—" for n in names))
    Console().print(table)
    for label, answers, scores in summaries:
        print(json.dumps({"environment": args.environment, "model": label, "answers": answers, **scores}))
    return 0


def _setup(args: argparse.Namespace, taskset):
    """How the rows run: `--harness` and `--harness-option`s over the recipe entry for this
    environment (`--recipe`'s, or the run's with `--run-dir`), over the taskset's own harness;
    checked as a recipe's would be."""
    from rollwire.core.errors import ConfigError
    from rollwire.producers.environment import EnvironmentSetup
    from rollwire.run.recipe import RunRecipe, load_recipe
    setup = EnvironmentSetup()
    recipe = None
    if args.recipe is not None:
        try:
            recipe = load_recipe(args.recipe)
        except ConfigError as exc:
            raise SystemExit(f"rollwire eval: {exc}") from None
    elif args.run_dir is not None and (args.run_dir / "recipe.json").is_file():
        recipe = RunRecipe.model_validate_json((args.run_dir / "recipe.json").read_text())
    if recipe is not None:
        entry = next((e for e in recipe.environments if e.name == args.environment), None)
        if entry is None and args.recipe is not None:
            raise SystemExit(f"rollwire eval: {args.recipe} has no [[environments]] entry named {args.environment!r} "
                             f"(it has {', '.join(e.name for e in recipe.environments)})")
        if entry is not None:
            setup = entry.setup()
    given = parse_options(args.harness_option, "rollwire eval", "--harness-option")
    update: dict = {"harness_options": {**setup.harness_options, **given}}
    if args.harness:
        update["harness"] = args.harness
    setup = setup.model_copy(update=update)
    setup.check(type(taskset), args.environment)
    return setup


def _versions(args: argparse.Namespace, taskset, settings: dict, bar) -> list:
    """`--run-dir` with `--version`s: one managed vLLM server on the run's base model, each version
    loaded into it in turn and evaluated."""
    import tempfile

    from rollwire.consumers.vllm_server import VllmServer
    from rollwire.core.bus import open_log
    from rollwire.core.objectstore import open_store
    from rollwire.producers.evaluate import Contender, evaluate_versions, published_version
    from rollwire.run.recipe import RunRecipe
    from rollwire.schemas.topics import Topics
    if not args.version:
        raise SystemExit("rollwire eval: --run-dir needs one --version POLICY@V or more")
    recipe_path = args.run_dir / "recipe.json"
    if not recipe_path.is_file():
        raise SystemExit(f"rollwire eval: {args.run_dir} holds no recipe.json: give the directory of a run")
    recipe = RunRecipe.model_validate_json(recipe_path.read_text())
    contenders = []
    with open_log(recipe.bus) as log:
        for text in args.version:
            policy, sep, number = text.rpartition("@")
            if not sep or not number.isdigit():
                raise SystemExit(f"rollwire eval: --version {text!r} must be POLICY@VERSION, e.g. policy@150")
            topics = [Topics(recipe.topic_prefix)] + ([Topics(policy)] if policy != recipe.topic_prefix else [])
            contenders.append(Contender(text, published_version(log, topics, policy, int(number))))
    server_settings = recipe.server_settings().model_copy(
        update={"enable_lora": True, "log_path": args.run_dir / "logs" / "eval-vllm.log"})
    server = VllmServer(server_settings)
    server.start()
    try:
        if "tool_call_format" not in settings:  # as the run's env workers read it
            settings["tool_call_format"] = server.control.tool_call_format(server_settings.served_model_name) or "hermes"
        with tempfile.TemporaryDirectory() as work:
            results: list = []
            for contender in contenders:  # a bar each, as each version's turn comes
                results += evaluate_versions(
                    taskset, [contender], store=open_store(recipe.store), control=server.control,
                    base_url=f"{server.base_url}/v1", served_model=server_settings.served_model_name,
                    work_dir=Path(work) / str(len(results)), on_result=bar(contender.label), **settings)
    finally:
        server.stop()
    return results
