"""`rollwire eval`: an environment against any OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def add_evaluate(sub) -> None:
    evaluate = sub.add_parser(
        "eval", help="score an environment against any OpenAI-compatible endpoint",
        description="Runs an environment's rows against an OpenAI-compatible endpoint (a local vLLM server, "
                    "or an API model: no logprobs are needed) and prints the mean of each reward and metric. "
                    "Environments are evals.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  rollwire eval reverse-digits --base-url http://127.0.0.1:8000/v1 --model policy -n 50\n"
               "  rollwire eval math-word --option path=data/gsm8k_test.jsonl --base-url https://api.example/v1 "
               "--model some-model")
    evaluate.add_argument("environment", help="registered taskset, e.g. reverse-digits or math-word")
    evaluate.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, ending in /v1")
    evaluate.add_argument("--model", required=True, help="model name the endpoint serves")
    evaluate.add_argument("-n", "--limit", type=int, default=20, help="rows to evaluate (default: %(default)s)")
    evaluate.add_argument("--samples", type=int, default=1, help="answers per row (default: %(default)s)")
    evaluate.add_argument("--temperature", type=float, default=0.0, help="(default: %(default)s)")
    evaluate.add_argument("--max-tokens", type=int, default=256, help="(default: %(default)s)")
    evaluate.add_argument("--concurrency", type=int, default=4, help="requests at once (default: %(default)s)")
    evaluate.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                          help="taskset option, e.g. path=data.jsonl or seed=3 (repeatable)")
    evaluate.add_argument("--out", type=Path, help="write every scored answer as JSON lines")
    evaluate.set_defaults(run=cmd_eval)


def _option_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from rollwire.producers.evaluate import OpenAIEndpoint, evaluate, summary
    from rollwire.producers.tasksets import load_taskset
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"rollwire eval: --option {item!r} needs the form KEY=VALUE")
        options[key] = _option_value(value)
    taskset = load_taskset(args.environment, **options)
    endpoint = OpenAIEndpoint(args.base_url, args.model, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"))
    console = Console(stderr=True)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"{args.environment} on {args.model}", total=args.limit * args.samples)
        results = evaluate(taskset, endpoint, limit=args.limit, samples=args.samples, temperature=args.temperature,
                           max_tokens=args.max_tokens, concurrency=args.concurrency,
                           on_result=lambda _: progress.advance(bar))
    if args.out:
        with open(args.out, "w") as out:
            for r in results:
                out.write(json.dumps(r.__dict__) + "\n")
    table = Table(title=f"{args.environment}: {len(results)} answers from {args.model}")
    table.add_column("score")
    table.add_column("mean", justify="right")
    scores = summary(results)
    for name, value in scores.items():
        table.add_row(name, f"{value:.3f}")
    Console().print(table)
    print(json.dumps({"environment": args.environment, "model": args.model, "answers": len(results), **scores}))
    return 0
