"""`rollwire promote` and `rollwire rollback`: which weight versions production serves."""

from __future__ import annotations

import argparse

from rollwire.cli.options import add_run_options, add_store_options, recorded_run, store_settings

FLOW = ("Serving replicas (`rollwire inference --follow serving [--lane canary]`) load what the decision\n"
        "gives their lane, older versions included; `rollwire serve --fleet` sends each request to the\n"
        "canary with its share, else to the stable version. Nothing restarts; the training loop's\n"
        "replicas keep following every version. Each decision is an event on <prefix>.serving, kept\n"
        "forever: `rollwire tail serving` shows the history.")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("version", type=int, help="weight version (as published by the trainer)")
    parser.add_argument("--policy", default=None, help="policy (default: the run's, with --run-dir; else policy)")
    parser.add_argument("--note", default="", help="why, in words; kept in the decision")
    parser.add_argument("--by", default=None, help="who decides (default: this user)")
    add_store_options(parser, "weights; with --run-dir, the run's")
    add_run_options(parser)


def _decision_parser(sub, name: str, *, help: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """A command that makes one serving decision: its text, then the options every decision takes."""
    parser = sub.add_parser(name, help=help, description=description + "\n\n" + FLOW, epilog=epilog,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(parser)
    return parser


def add_promote(sub) -> None:
    promote = _decision_parser(
        sub, "promote", help="make a weight version serve production, or put it on trial as a canary",
        description="Makes VERSION the stable version production serves, or with --canary SHARE sends that\n"
                    "share of requests to it beside the stable version.",
        epilog="examples:\n"
               "  rollwire promote 25 --run-dir runs/demo      # the run's log, prefix, store and policy\n"
               "  rollwire promote 14 --store-dir runs/demo/weights --log-dir runs/demo/log --prefix demo\n"
               "  rollwire promote 15 --canary 0.1 --note \"reward +0.03 offline\"   # 10% of requests\n"
               "  rollwire promote 15                                         # the canary did well")
    promote.add_argument("--canary", type=float, metavar="SHARE", help="share of requests for VERSION, in (0, 1); "
                         "the stable version keeps the rest")
    promote.set_defaults(run=cmd_promote)


def add_rollback(sub) -> None:
    rollback = _decision_parser(
        sub, "rollback", help="serve an earlier verified weight version again, without restarting anything",
        description="Makes VERSION the stable version again and withdraws any canary. VERSION must have been\n"
                    "stable before (a verified version); --force serves one that never was.",
        epilog="example:\n  rollwire rollback 14 --note \"v15 repeats itself\" --bus kafka --prefix prod --store s3")
    rollback.add_argument("--force", action="store_true", help="roll back to a version that was never stable")
    rollback.set_defaults(run=cmd_rollback)


def _decide(args: argparse.Namespace, decide) -> int:
    """Opens the log and the store, makes the decision (`promote` or `rollback`), prints it."""
    from rollwire.core.bus import catalog_topics, open_log
    from rollwire.core.objectstore import open_store
    from rollwire.producers.releases import describe
    from rollwire.schemas.topics import Topics
    run, log_settings, prefix = recorded_run(args)
    store = open_store(run.store if run is not None else store_settings(args))
    policy = args.policy or (run.trainer.policy if run is not None else "policy")
    topics = Topics(prefix)
    with open_log(log_settings) as log:
        log.create_topics(catalog_topics(topics))
        decision = decide(log, topics, store, policy=policy, version=args.version, decided_by=args.by, note=args.note)
    print(describe(decision))
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from rollwire.producers.releases import promote
    return _decide(args, lambda *a, **kw: promote(*a, canary_share=args.canary, **kw))


def cmd_rollback(args: argparse.Namespace) -> int:
    from rollwire.producers.releases import rollback
    return _decide(args, lambda *a, **kw: rollback(*a, force=args.force, **kw))
