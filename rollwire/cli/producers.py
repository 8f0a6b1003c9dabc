"""`rollwire dispatch` and `rollwire env-worker`: tasks out, rollouts in."""

from __future__ import annotations

import argparse
import json
import shlex

from rollwire.cli.options import (
    add_bus_options,
    add_settings_flags,
    add_store_options,
    bus_settings,
    settings_flags,
    store_settings,
)
from rollwire.producers.dispatcher import DispatcherSettings, EnvironmentMix
from rollwire.producers.env_worker import EnvWorkerSettings
from rollwire.schemas.rollout import SamplingParams
from rollwire.trainer.settings import BatchSettings

WORKER_FLAGS = ["concurrency", "inference_concurrency", "inference_window_s", "rollout_timeout_s", "runtime", "drain_s",
                "group_id"]


def add_dispatch(sub) -> None:
    dispatch = sub.add_parser(
        "dispatch", help="hand out tasks from a mix of environments, paced by the off-policy budget",
        description="Issues task events from one or more environments, mixed by weight, each naming its "
                    "advantage algorithm; keeps the rollouts that are sampling within (max_off_policy + 1) trainer "
                    "batches, plus up to --waiting-rollouts that wait on their environment, reading trainer steps, "
                    "drops and the env workers' first generation requests to know what is where.",
        epilog="example:\n  rollwire dispatch --env reverse-digits --env math-word:0.25 "
               "--option math-word.path=data/gsm8k.jsonl --group-size 8",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    dispatch.add_argument("--env", action="append", required=True, metavar="NAME[:WEIGHT]",
                          help="an environment and its share (repeatable; weight 1 by default)")
    dispatch.add_argument("--option", action="append", default=[], metavar="ENV.KEY=VALUE",
                          help="taskset option, e.g. reverse-digits.seed=3 (repeatable)")
    mix = dispatch.add_argument_group("every environment's groups (settings of rollwire.producers.dispatcher.EnvironmentMix)")
    add_settings_flags(mix, EnvironmentMix, ["algorithm", "group_size"])
    add_settings_flags(mix, SamplingParams, ["temperature", "max_tokens"])
    budget = dispatch.add_argument_group("the trainer's batches, which set the budget (trainer.batch in a recipe)")
    add_settings_flags(budget, BatchSettings, ["max_off_policy", "batch_rollouts", "waiting_rollouts"])
    add_settings_flags(dispatch, DispatcherSettings, ["seed"])
    dispatch.add_argument("--max-groups", type=int, help="stop after issuing this many groups")
    add_bus_options(dispatch)
    dispatch.set_defaults(run=cmd_dispatch)


def add_env_worker(sub) -> None:
    worker = sub.add_parser(
        "env-worker", help="run environments: tasks in, rollouts and traces out, against a vLLM server",
        description="Consumes task events in a consumer group (start more workers for more throughput), runs "
                    "each group's rollouts through the interception layer of a vLLM server (every sampled "
                    "token id, logprob and weight version recorded), judges them with the taskset's rewards "
                    "and publishes rollout and trace events.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    worker.add_argument("--base-url", help="one vLLM server, e.g. http://127.0.0.1:8000 (no /v1); without it, every "
                                           "replica that reports on the fleet topic, routed by weight version")
    worker.add_argument("--env", action="append", required=True, help="environment to run (repeatable)")
    worker.add_argument("--option", action="append", default=[], metavar="ENV.KEY=VALUE",
                        help="taskset option, e.g. math-word.path=data.jsonl (repeatable)")
    worker.add_argument("--agent-command", help="run this agent program for every rollout instead of the taskset's "
                                                "harness; it gets OPENAI_BASE_URL and ROLLWIRE_TASK (with --runtime "
                                                "container it runs in the rollout's container)")
    worker.add_argument("--container-image", metavar="IMAGE",
                        help="with --runtime container: the image each rollout runs in (default local/python:3.11)")
    add_settings_flags(worker.add_argument_group("worker (settings of rollwire.producers.env_worker.EnvWorkerSettings)"),
                       EnvWorkerSettings, WORKER_FLAGS)
    worker.add_argument("--exit-when-idle", type=float, metavar="SECONDS", help="stop after SECONDS without tasks")
    add_bus_options(worker)
    add_store_options(worker, purpose="traces too large for one event")
    worker.set_defaults(run=cmd_env_worker)


def _tasksets(names: list[str], options: list[str]) -> dict:
    from rollwire.producers.tasksets import load_taskset
    per_env: dict[str, dict] = {name: {} for name in names}
    for item in options:
        target, sep, value = item.partition("=")
        env, dot, key = target.partition(".")
        if not sep or not dot or env not in per_env:
            raise SystemExit(f"--option {item!r} needs the form ENV.KEY=VALUE with ENV one of {', '.join(per_env)}")
        try:
            per_env[env][key] = json.loads(value)
        except ValueError:
            per_env[env][key] = value
    return {name: load_taskset(name, **opts) for name, opts in per_env.items()}


def cmd_dispatch(args: argparse.Namespace) -> int:
    from rollwire.core.bus import catalog_topics, open_log
    from rollwire.producers.entry import serve_dispatcher
    from rollwire.schemas.topics import Topics
    weights = {}
    for spec in args.env:
        name, _, weight = spec.partition(":")
        weights[name] = float(weight or 1.0)
    tasksets = _tasksets(list(weights), args.option)
    sampling = SamplingParams(**settings_flags(args, ["temperature", "max_tokens"]))
    mix = [(EnvironmentMix(name=n, weight=w, sampling=sampling, **settings_flags(args, ["algorithm", "group_size"])),
            tasksets[n]) for n, w in weights.items()]
    budget = BatchSettings(**settings_flags(args, ["max_off_policy", "batch_rollouts", "waiting_rollouts"]))
    topics = Topics(args.prefix)
    with open_log(bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        issued = serve_dispatcher(log, topics, mix, budget, DispatcherSettings(seed=args.seed), max_groups=args.max_groups)
    print(json.dumps({"groups_issued": issued}))
    return 0


def cmd_env_worker(args: argparse.Namespace) -> int:
    from rollwire.core.bus import catalog_topics, open_log
    from rollwire.core.objectstore import open_store
    from rollwire.producers.entry import serve_env_worker
    from rollwire.schemas.topics import Topics
    tasksets = _tasksets(args.env, args.option)
    topics = Topics(args.prefix)
    settings = EnvWorkerSettings(**settings_flags(args, WORKER_FLAGS))
    agent = shlex.split(args.agent_command) if args.agent_command else None
    if settings.runtime == "container":  # the agent program runs in each rollout's container
        settings.container = settings.container.model_copy(update={
            k: v for k, v in (("command", agent), ("image", args.container_image)) if v})
    elif args.container_image:
        raise SystemExit("--container-image needs --runtime container")
    with open_log(bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        published = serve_env_worker(log, topics, tasksets, settings, store=open_store(store_settings(args)),
                                     base_url=args.base_url, agent_command=agent, idle_exit_s=args.exit_when_idle)
    print(json.dumps({"rollouts_published": published}))
    return 0
