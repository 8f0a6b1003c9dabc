"""`rollwire dispatch` and `rollwire env-worker`: tasks out, rollouts in."""

from __future__ import annotations

import argparse
import json
import shlex
import time

from rollwire.cli.options import add_bus_options, bus_settings


def add_dispatch(sub) -> None:
    dispatch = sub.add_parser(
        "dispatch", help="hand out tasks from a mix of environments, paced by the off-policy budget",
        description="Issues task events from one or more environments, mixed by weight, each naming its "
                    "advantage algorithm; keeps the rollouts in flight within (max_off_policy + 1) trainer "
                    "batches, reading trainer steps and drops to know what is done.",
        epilog="example:\n  rollwire dispatch --env reverse-digits --env math-word:0.25 "
               "--option math-word.path=data/gsm8k.jsonl --group-size 8",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    dispatch.add_argument("--env", action="append", required=True, metavar="NAME[:WEIGHT]",
                          help="an environment and its share (repeatable; weight 1 by default)")
    dispatch.add_argument("--option", action="append", default=[], metavar="ENV.KEY=VALUE",
                          help="taskset option, e.g. reverse-digits.seed=3 (repeatable)")
    dispatch.add_argument("--algorithm", default="grpo", help="advantage algorithm of every group (default: %(default)s)")
    dispatch.add_argument("--group-size", type=int, default=8, help="rollouts per task (default: %(default)s)")
    dispatch.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: %(default)s)")
    dispatch.add_argument("--max-tokens", type=int, default=256, help="tokens per inference call (default: %(default)s)")
    dispatch.add_argument("--max-off-policy", type=int, default=2, help="the trainer's setting (default: %(default)s)")
    dispatch.add_argument("--batch-rollouts", type=int, default=64, help="the trainer's setting (default: %(default)s)")
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
    worker.add_argument("--base-url", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000 (no /v1)")
    worker.add_argument("--env", action="append", required=True, help="environment to run (repeatable)")
    worker.add_argument("--option", action="append", default=[], metavar="ENV.KEY=VALUE",
                        help="taskset option, e.g. math-word.path=data.jsonl (repeatable)")
    worker.add_argument("--agent-command", help="run this agent program for every rollout instead of the taskset's "
                                                "harness; it gets OPENAI_BASE_URL and ROLLWIRE_TASK")
    worker.add_argument("--runtime", choices=["in-process", "subprocess"], default="in-process",
                        help="where the taskset's harness runs: in this process, or in a child process per rollout "
                             "that reaches the model through the rollout's interception URL (default: %(default)s)")
    worker.add_argument("--concurrency", type=int, default=16,
                        help="rollouts in flight at once, waiting on environments included (default: %(default)s)")
    worker.add_argument("--inference-concurrency", type=int, default=32,
                        help="generation requests in flight to the server at once (default: %(default)s)")
    worker.add_argument("--inference-window", type=float, default=0.0, metavar="SECONDS",
                        help="let a generation request wait up to SECONDS for others to reach the server with it as "
                             "one batch; helps a CPU-bound server under slow environments (default: %(default)s)")
    worker.add_argument("--exit-when-idle", type=float, metavar="SECONDS", help="stop after SECONDS without tasks")
    add_bus_options(worker)
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
    from rollwire.bus import catalog_topics, open_log
    from rollwire.producers.dispatcher import Dispatcher, DispatcherSettings, EnvironmentMix
    from rollwire.schemas.rollout import SamplingParams
    from rollwire.schemas.topics import Topics
    weights = {}
    for spec in args.env:
        name, _, weight = spec.partition(":")
        weights[name] = float(weight or 1.0)
    tasksets = _tasksets(list(weights), args.option)
    sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    mix = [(EnvironmentMix(name=n, weight=w, algorithm=args.algorithm, group_size=args.group_size, sampling=sampling),
            tasksets[n]) for n, w in weights.items()]
    topics = Topics(args.prefix)
    with open_log(bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        dispatcher = Dispatcher(log, topics, mix, DispatcherSettings(max_off_policy=args.max_off_policy,
                                                                     batch_rollouts=args.batch_rollouts))
        issued = 0
        try:
            while args.max_groups is None or issued < args.max_groups:
                issued += dispatcher.step(timeout_s=0.5)
        except KeyboardInterrupt:
            pass
        finally:
            dispatcher.close()
    print(json.dumps({"groups_issued": issued}))
    return 0


def cmd_env_worker(args: argparse.Namespace) -> int:
    from rollwire.bus import catalog_topics, open_log
    from rollwire.consumers.vllm_control import VllmControl
    from rollwire.producers.env_worker import EnvWorker, EnvWorkerSettings
    from rollwire.producers.harnesses import script_harness
    from rollwire.producers.interception_server import InterceptionServer
    from rollwire.schemas.topics import Topics
    tasksets = _tasksets(args.env, args.option)
    topics = Topics(args.prefix)
    server = InterceptionServer() if args.agent_command else None
    harness = script_harness(shlex.split(args.agent_command), server) if server else None
    with open_log(bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        worker = EnvWorker(log, topics, VllmControl(args.base_url), tasksets,
                           EnvWorkerSettings(concurrency=args.concurrency, runtime=args.runtime,
                                             inference_concurrency=args.inference_concurrency,
                                             inference_window_s=args.inference_window), harness=harness)
        try:
            worker.run(idle_exit_s=args.exit_when_idle)
        except KeyboardInterrupt:
            pass
        finally:
            worker.close()
            if server:
                server.shutdown()
    print(json.dumps({"rollouts_published": worker.published_total}))
    return 0
