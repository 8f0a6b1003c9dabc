"""`rollwire explore`: a web page over a run's log, live as the run goes or after it ended."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rollwire.cli.options import add_run_options, recorded_run

DESCRIPTION = """\
Serves a page over a run's events, live while the run goes and after it ended:
  curves     reward per environment, staleness, throughput, losses and the loss's metrics,
             consumer lag per group, reload pause per replica, drops by reason; zoomable, live
  rollouts   search and filter by environment, step, version, reward and fate; one rollout's
             story: its tokens coloured by mask, weight version or logprob, its turns and tool
             calls, its group side by side, its trace (with --trace-url)
  steps      what each trainer step trained, and when each replica served its weights
  replays    each `rollwire replay score` of the run against the record: changes, sign flips
  fleet      replicas, the version each serves, weight versions, serving decisions
It reads the log as a consumer that commits nothing, in pages: the run never notices it."""


def add_explore(sub) -> None:
    explore = sub.add_parser(
        "explore", help="a web page over a run's log: curves, rollouts and their tokens, steps, replays, fleet",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  rollwire explore --run-dir runs/demo            then open http://127.0.0.1:8352\n"
               "  rollwire explore --bus kafka --bootstrap 127.0.0.1:9092 --prefix run7 --tokenizer runs/run7/base\n"
               "  ROLLWIRE_EXPLORE_TOKENS=me=$(openssl rand -hex 16) rollwire explore --run-dir runs/demo --host 0.0.0.0")
    explore.add_argument("--host", default="127.0.0.1",
                         help="where to listen (default: %(default)s; beyond loopback it needs bearer tokens)")
    explore.add_argument("--port", type=int, default=8352, help="port (default: %(default)s; 0 picks a free one)")
    explore.add_argument("--tokens", type=Path,
                         help="bearer tokens, `NAME TOKEN` a line (also $ROLLWIRE_EXPLORE_TOKENS=NAME=TOKEN,...); "
                              "open the page as http://HOST:PORT/?token=TOKEN")
    explore.add_argument("--tokenizer", type=Path,
                         help="a tokenizer directory to show tokens as text (default: the run's base model)")
    explore.add_argument("--trace-url", default=os.environ.get("ROLLWIRE_TRACE_URL"),
                         help="a trace viewer URL with {trace_id}, e.g. http://127.0.0.1:16686/trace/{trace_id} "
                              "(default: $ROLLWIRE_TRACE_URL)")
    explore.add_argument("--replay", action="append", default=[], metavar="PREFIX",
                         help="a replay's shadow prefix to compare (repeatable; with --run-dir, the replays "
                              "reported into <run-dir>/replays/ are found)")
    explore.add_argument("--max-rollouts", type=int, default=200_000,
                         help="rollouts the page keeps listed, the newest (default: %(default)s, ~500 B each)")
    add_run_options(explore)
    explore.set_defaults(run=cmd_explore)


def cmd_explore(args: argparse.Namespace) -> int:
    from rollwire.cli.inspect import _tokenizer
    from rollwire.core.bus import open_log
    from rollwire.core.errors import ConfigError
    from rollwire.core.http_service import check_exposure, load_tokens
    from rollwire.explore.entry import serve_explorer
    from rollwire.schemas.topics import Topics

    if args.max_rollouts < 1:
        raise ConfigError("--max-rollouts must be at least 1")
    run, log_settings, prefix = recorded_run(args)
    tokens = load_tokens(args.tokens, "ROLLWIRE_EXPLORE_TOKENS")
    check_exposure(args.host, tokens, "the run's rollouts, prompts and completions")
    tokenizer: Any = _tokenizer(args.tokenizer, run)
    decode = (lambda ids: [tokenizer.decode([i]) for i in ids]) if tokenizer is not None else None
    with open_log(log_settings) as log:
        serve_explorer(log, Topics(prefix), name=run.name if run else prefix, host=args.host, port=args.port,
                       decode=decode, trace_url=args.trace_url, run_dir=args.run_dir, replays=args.replay,
                       tokens=tokens, max_rollouts=args.max_rollouts,
                       planned_steps=run.steps if run else None)
    return 0
