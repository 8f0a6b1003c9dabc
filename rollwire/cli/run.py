"""`rollwire run`: the main job."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_run(sub) -> None:
    run = sub.add_parser(
        "run", help="run the whole loop on this machine from a recipe (default: the bundled demo)",
        description="Starts everything a training run needs as supervised processes: one managed vLLM\n"
                    "server with its weight subscriber, the group scorer, the trainer, env workers and the\n"
                    "dispatcher, on the embedded log (or Kafka with --bus kafka). Shows live progress, writes\n"
                    "one metrics line per trainer step and draws the reward curve at the end. Ctrl-C stops\n"
                    "every component in order; the same command resumes from the last checkpoint.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  rollwire run                                   # the demo: a tiny model learns to reverse digits\n"
               "  rollwire run --steps 30 --metrics-out m.jsonl  # shorter, metrics where you want them\n"
               "  rollwire run my.toml --bus kafka --bootstrap 127.0.0.1:9092\n"
               "  rollwire run --print-recipe > my.toml          # start a recipe of your own from the demo's\n"
               "  rollwire run stack.toml --prepare-only         # recipe.json, model, topics: then each role on its own\n"
               "                                                 # (python -m rollwire.run.roles ROLE <run_dir>/recipe.json)\n\n"
               "outputs (under the run directory, runs/<name> by default): recipe.json, metrics.jsonl,\n"
               "reward_curve.png, logs/<component>.log, trainer/ (checkpoints), weights/, log/ (embedded events)")
    run.add_argument("recipe", nargs="?", type=Path, help="recipe TOML (default: the bundled demo)")
    run.add_argument("--steps", type=int, help="trainer steps (overrides the recipe's `steps`)")
    run.add_argument("--run-dir", type=Path, help="run directory (default: runs/<name>)")
    run.add_argument("--name", help="run name: default run directory and topic prefix")
    run.add_argument("--metrics-out", type=Path, help="metrics JSONL path (default: <run_dir>/metrics.jsonl)")
    run.add_argument("--bus", choices=["embedded", "kafka"], help="event log (overrides bus.type)")
    run.add_argument("--bootstrap", help="Kafka bootstrap servers host:port (overrides bus.bootstrap_servers)")
    run.add_argument("--warm-start-steps", type=int, help="supervised warm-start steps (overrides warm_start.steps)")
    run.add_argument("--prepare-only", action="store_true",
                     help="write <run_dir>/recipe.json, build the starting model and create the topics, then exit: "
                          "for deployments that start each role themselves (docker-compose.yml)")
    run.add_argument("--print-recipe", action="store_true",
                     help="print the recipe (default: the demo) with every setting, its value and its doc, and exit")
    run.set_defaults(run=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from rollwire.run.recipe import load_recipe
    recipe = load_recipe(args.recipe, steps=args.steps, run_dir=str(args.run_dir) if args.run_dir else None,
                         name=args.name, **{"bus.type": args.bus, "bus.bootstrap_servers": args.bootstrap,
                                             "warm_start.steps": args.warm_start_steps})
    if args.print_recipe:
        from rollwire.run.recipe_print import recipe_toml
        print(recipe_toml(recipe), end="")
        return 0
    if args.prepare_only:
        from rollwire.run.runner import prepare
        path = prepare(recipe)
        print(f"prepared {recipe.name}: {path}; start each role with `python -m rollwire.run.roles ROLE {path}`")
        return 0
    from rollwire.run.runner import run
    try:
        result = run(recipe, metrics_out=args.metrics_out)
    except KeyboardInterrupt:  # before any component started (e.g. during the warm start)
        print("rollwire run: interrupted before training started; the same command starts again")
        return 130
    return 130 if result.interrupted else 0
