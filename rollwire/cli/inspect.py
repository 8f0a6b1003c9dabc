"""`rollwire inspect rollout ID`, `rollwire inspect step N` and `rollwire inspect run`: one rollout's
or one step's story, or the whole run's accounts."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rollwire.cli.options import add_command_group, add_run_options, add_step, recorded_run


def add_inspect(sub) -> None:
    what = add_command_group(sub, "inspect", metavar="WHAT",
                             help="the story of one rollout or one trainer step, from the run's events",
                             description="Reads a run's topics and tells what happened to one rollout or one step.")
    rollout = add_step(
        what, "rollout", help="a rollout: task, decoded prompt and completion, versions, rewards, group, fate",
        description="Its task; the prompt and completion decoded, with the tokens the model did not sample\n"
                    "(environment and tool text) inside ⟦ ⟧; the weight version of each sampled span; its\n"
                    "reward terms, group rewards and advantage; its group's other members; the trainer step\n"
                    "that used it, or why it was dropped; its trace id.",
        epilog="examples:\n  rollwire inspect rollout 3f2a9c-2 --run-dir runs/demo\n"
               "  rollwire inspect rollout g7-0 --bus kafka --prefix run7 --tokenizer runs/run7/base")
    rollout.add_argument("rollout_id", metavar="ID", help="the rollout id (`rollwire tail rollouts` shows them)")
    rollout.add_argument("--tokenizer", type=Path,
                         help="a tokenizer directory to decode tokens with (default: the run's base model; "
                              "without one, token ids are printed)")
    rollout.add_argument("--trace-url", default=os.environ.get("ROLLWIRE_TRACE_URL"),
                         help="a trace viewer URL with {trace_id}, e.g. http://jaeger:16686/trace/{trace_id} "
                              "(default: $ROLLWIRE_TRACE_URL)")
    add_run_options(rollout)
    rollout.set_defaults(run=cmd_inspect_rollout)
    step = add_step(what, "step", help="a trainer step: what it trained, its losses, who loaded its weights",
                    description="Rollouts per environment, staleness, loss metrics, the version it produced\n"
                                "and when each replica served it.")
    step.add_argument("step", type=int, metavar="N", help="the trainer step")
    add_run_options(step)
    step.set_defaults(run=cmd_inspect_step)
    accounts = add_step(
        what, "run", help="the run's accounts: every dispatched rollout trained, dropped or in flight",
        description="What became of every rollout the dispatcher asked for (trained once, dropped with a\n"
                    "reason, or still in flight, and where), trainer steps, published versions and the\n"
                    "version each replica last served; then whether the run kept its promises: no rollout\n"
                    "trained twice, no step number twice, versions strictly increasing, replicas on the\n"
                    "newest. Exits 1 when a promise is broken.",
        epilog="examples:\n  rollwire inspect run --run-dir runs/demo\n"
               "  rollwire inspect run --bus kafka --bootstrap 127.0.0.1:9092 --prefix run7")
    add_run_options(accounts)
    accounts.set_defaults(run=cmd_inspect_run)


def _tokenizer(path: Path | None, run) -> object | None:
    candidate = path or (Path(run.base_model) if run is not None else None)
    if candidate is None or not (candidate / "tokenizer_config.json").is_file():
        if path is not None:
            from rollwire.core.errors import ConfigError
            raise ConfigError(f"--tokenizer {path} holds no tokenizer (no tokenizer_config.json)")
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(candidate))


def cmd_inspect_rollout(args: argparse.Namespace) -> int:
    from rollwire.core.bus import open_log
    from rollwire.run.inspect import render_rollout, rollout_story
    from rollwire.schemas.topics import Topics
    run, log_settings, prefix = recorded_run(args)
    with open_log(log_settings) as log:
        story = rollout_story(log, Topics(prefix), args.rollout_id)
    print(render_rollout(story, _tokenizer(args.tokenizer, run), args.trace_url), end="")
    return 0


def cmd_inspect_step(args: argparse.Namespace) -> int:
    from rollwire.core.bus import open_log
    from rollwire.run.inspect import render_step, step_story
    from rollwire.schemas.topics import Topics
    _, log_settings, prefix = recorded_run(args)
    with open_log(log_settings) as log:
        print(render_step(step_story(log, Topics(prefix), args.step)), end="")
    return 0


def cmd_inspect_run(args: argparse.Namespace) -> int:
    from rollwire.core.bus import open_log
    from rollwire.run.ledger import render_ledger, run_ledger
    from rollwire.schemas.topics import Topics
    _, log_settings, prefix = recorded_run(args)
    with open_log(log_settings) as log:
        ledger = run_ledger(log, Topics(prefix))
    print(render_ledger(ledger), end="")
    return 1 if ledger.problems() else 0
