"""The `rollwire` command. Entry points stay thin: parse arguments, configure logging, then import
what the subcommand needs (so `rollwire --help` never loads Kafka, torch or vLLM).

    options.py    the event-log and object-store options several commands share
    logs.py       topics, tail
    producers.py  dispatch, env-worker
    services.py   score, inference, train
    evaluate.py   eval
    environments.py  env list, env init, env check (environments people bring)
    models.py     model import (a GGUF checkpoint to a model folder)
    run.py        run (the whole loop from a recipe)
    replay.py     replay score, replay train (re-score or retrain a recorded run into shadow topics)
    feedback.py   serve (the serving gateway), feedback serve/import, join (production feedback to samples)
    inspect.py    inspect rollout, inspect step (one rollout's or step's story from the events)
    explore.py    explore (a web page over a run's log)
"""

from __future__ import annotations

import argparse
import logging
import sys

from rollwire.cli import (
    environments,
    evaluate,
    explore,
    feedback,
    inspect,
    logs,
    models,
    producers,
    releases,
    replay,
    run,
    services,
)

DESCRIPTION = """\
rollwire: asynchronous RL post-training for LLMs, as an event-sourced streaming system.

Every fact of a run (a task, a rollout, a score, a trainer step, a weight version) is an event
on a log: the embedded log in a local directory by default, or Kafka with --bus kafka.
"""

EPILOG = """\
examples:
  rollwire run                                 the demo: everything on this machine, learning for real
  rollwire topics                              the topic catalog: events, keys, who writes and reads
  rollwire env init sorting                    a package for your own environment (pip install -e sorting)
  rollwire model import model.gguf --out models/m   a GGUF checkpoint as a model folder to train
  rollwire topics --create --bus kafka --bootstrap 127.0.0.1:9092
  rollwire tail rollouts --log-dir runs/demo/log --since 10m
  rollwire tail deadletter --bus kafka --from-beginning --limit 20
  rollwire score --bus kafka --config scorer.toml   a faust worker of the group scorer
  rollwire inference --model runs/demo/base --port 8000   a vLLM replica following the weights topic
  rollwire replay score --run-dir runs/demo --into demo-rloo --algorithm rloo   what RLOO would have trained
  rollwire inspect rollout ID --run-dir runs/demo   one rollout's story (ids: rollwire tail scored --json)
  rollwire explore --run-dir runs/demo          a web page over the run: curves, rollouts, steps, fleet
  rollwire serve --upstream http://127.0.0.1:8000   an OpenAI-compatible gateway whose responses carry receipts
  rollwire feedback serve --log-dir runs/demo/log --prefix demo   the feedback ingestion API on :8340
  rollwire join --log-dir runs/demo/log --prefix demo   feedback joined with served responses into samples
  rollwire promote 15 --canary 0.1 / rollwire rollback 14   which versions production serves

Run `rollwire COMMAND --help` for the options of each command.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollwire", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--traces", choices=["none", "console", "otlp"], default="none",
                        help="OpenTelemetry spans of this process: printed, or sent over OTLP/HTTP (needs the otlp "
                             "extra); `rollwire run` takes this from its recipe's [telemetry] table instead")
    parser.add_argument("--otlp-endpoint", default="http://127.0.0.1:4318/v1/traces",
                        help="OTLP/HTTP traces endpoint for --traces otlp (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (run.add_run, logs.add_topics, logs.add_tail, producers.add_dispatch, producers.add_env_worker,
                services.add_score, services.add_inference, services.add_train, evaluate.add_evaluate, environments.add_env,
                replay.add_replay, inspect.add_inspect, explore.add_explore, feedback.add_serve, feedback.add_feedback,
                feedback.add_join,
                releases.add_promote, releases.add_rollback, models.add_model):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rollwire.core.errors import RollwireError
    from rollwire.core.processes import configure_logging, stop_on_sigterm, yield_idle_cpu
    yield_idle_cpu()  # before anything imports torch; every process a command starts inherits it
    configure_logging(logging.DEBUG if args.verbose else logging.INFO, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop_on_sigterm()  # commands that own a server (inference, faust's score) install their own handler
    provider = None
    try:
        if args.traces != "none":
            from rollwire.core.telemetry import TelemetrySettings, configure
            provider = configure(TelemetrySettings(exporter=args.traces, otlp_endpoint=args.otlp_endpoint,
                                                   service_name=f"rollwire-{args.command}"))
        return args.run(args)
    except RollwireError as exc:
        print(f"rollwire {args.command}: {exc}", file=sys.stderr)
        return 2
    finally:
        if provider is not None:
            provider.shutdown()


if __name__ == "__main__":
    sys.exit(main())
