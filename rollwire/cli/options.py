"""Options shared by several commands: the event log and the object store."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_bus_options(parser: argparse.ArgumentParser) -> None:
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
    group.add_argument("--kafka-security", type=Path, metavar="TOML",
                       help="a TOML file with a [bus.security] table, as in a recipe: SASL_SSL (SCRAM over TLS) "
                            "or mutual TLS; the password from $KAFKA_PASSWORD or the file it names")


def bus_settings(args: argparse.Namespace):
    from rollwire.core.bus import EmbeddedBusSettings, KafkaBusSettings
    from rollwire.core.bus.settings import KafkaSecurity
    if args.bus == "kafka":
        security = KafkaSecurity()
        if getattr(args, "kafka_security", None) is not None:
            import tomllib
            table = tomllib.loads(args.kafka_security.read_text()).get("bus", {}).get("security", {})
            security = KafkaSecurity.model_validate(table)
        return KafkaBusSettings(bootstrap_servers=args.bootstrap, security=security)
    return EmbeddedBusSettings(path=args.log_dir)


def add_store_options(parser: argparse.ArgumentParser, purpose: str = "weights") -> None:
    group = parser.add_argument_group(f"object store ({purpose})")
    group.add_argument("--store", choices=["local", "s3"], default="local",
                       help="local: a directory (default); s3: an S3-compatible server via minio")
    group.add_argument("--store-dir", type=Path, default=Path("runs/default/store"),
                       help="directory of the local store (default: %(default)s)")
    group.add_argument("--s3-endpoint", default=os.environ.get("S3_ENDPOINT", "127.0.0.1:8333"),
                       help="S3 host:port (default: $S3_ENDPOINT or %(default)s)")
    group.add_argument("--s3-bucket", default="rollwire", help="bucket (default: %(default)s)")
    group.add_argument("--s3-secure", action="store_true", help="use https")
    # Credentials come from $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY only, never from the command line
    # (shell history) or settings (recipe.json).


def store_settings(args: argparse.Namespace):
    from rollwire.core.objectstore import LocalStoreSettings, S3StoreSettings
    if args.store == "s3":
        return S3StoreSettings(endpoint=args.s3_endpoint, bucket=args.s3_bucket, secure=args.s3_secure)
    return LocalStoreSettings(root=args.store_dir)


def add_command_group(sub, name: str, *, help: str, description: str, metavar: str):
    """A command whose work is split in named steps (`rollwire replay score`, `rollwire inspect step`):
    returns the subparsers to add each step to; every step must be named."""
    command = sub.add_parser(name, help=help, description=description)
    return command.add_subparsers(dest=f"{name}_command", metavar=metavar, required=True)


def add_step(group, name: str, *, help: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """One step of `add_command_group`, its description and examples printed as written."""
    return group.add_parser(name, help=help, description=description, epilog=epilog,
                            formatter_class=argparse.RawDescriptionHelpFormatter)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """`--run-dir`, or the event-log options, to name a recorded run."""
    parser.add_argument("--run-dir", type=Path,
                        help="the run's directory: its recipe.json names the log and the prefix (otherwise the "
                             "event-log options below do)")
    add_bus_options(parser)


def recorded_run(args: argparse.Namespace):
    """(the run's recipe or None, its event-log settings, its topic prefix) from `add_run_options`."""
    if args.run_dir is None:
        return None, bus_settings(args), args.prefix
    from rollwire.core.errors import ConfigError
    from rollwire.run.recipe import RunRecipe
    path = args.run_dir / "recipe.json"
    if not path.is_file():
        raise ConfigError(f"{args.run_dir} holds no recipe.json: give the directory of a run `rollwire run` made")
    recipe = RunRecipe.model_validate_json(path.read_text())
    return recipe, recipe.bus, recipe.topic_prefix


def config_table(path: Path | None, table: str, command: str) -> dict:
    """The `[table]` of the TOML file given with --config (empty without a file); a file that
    cannot be read or parsed ends the command with a message naming it."""
    import tomllib
    if path is None:
        return {}
    try:
        return tomllib.loads(path.read_text()).get(table, {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(f"rollwire {command}: cannot read --config {path}: {exc}") from None


def validated(model, data: dict, table: str, command: str):
    """`model.model_validate(data)`; invalid settings end the command with the fields to change."""
    from pydantic import ValidationError
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(f"{table}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SystemExit(f"rollwire {command}: invalid settings: {fields}") from None


def _flag_type(annotation):
    """(argparse type, choices, is_bool) for a settings field's annotation."""
    import typing
    from pathlib import Path as _Path
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        choices = list(typing.get_args(annotation))
        return type(choices[0]), choices, False
    if annotation is bool:
        return None, None, True
    if annotation in (int, float, str):
        return annotation, None, False
    if annotation is _Path:
        return _Path, None, False
    return str, None, False


def add_settings_flags(parser, model, fields: list[str], *, overrides: bool = False) -> None:
    """One flag per field of the settings `model`, named after it (`max_off_policy` becomes
    `--max-off-policy`), with its type, choices and doc, so a command's flags cannot drift from the
    settings the recipe uses. A field without a default is a required flag. With `overrides`, unset
    flags leave the field to the config file (or to the command)."""
    import argparse as _argparse
    for name in fields:
        info = model.model_fields[name]
        kind, choices, is_bool = _flag_type(info.annotation)
        doc = (info.description or "").split("\n")[0].rstrip(".")
        required = info.is_required() and not overrides
        default = None if overrides or required else info.get_default(call_default_factory=True)
        shown = "" if overrides or required else " (default: %(default)s)"
        flag = "--" + name.replace("_", "-")
        if is_bool:
            parser.add_argument(flag, action=_argparse.BooleanOptionalAction, default=default, help=doc + shown)
        else:
            parser.add_argument(flag, type=kind, choices=choices, default=default, help=doc + shown,
                                required=required, metavar=None if choices else name.upper())


def settings_flags(args, fields: list[str]) -> dict:
    """The values of the flags `add_settings_flags` added, leaving out those not given (None)."""
    return {name: getattr(args, name) for name in fields if getattr(args, name) is not None}


def add_processor_options(parser, *, role: str, idle_help: str) -> None:
    """Options of a stream processor that runs on faust (Kafka) or in-process (either log)."""
    parser.add_argument("--driver", choices=["faust", "embedded"],
                        help="faust (default with --bus kafka: start more workers with the same --app-id to scale "
                             "out) or the in-process driver (default, and the only choice, with the embedded log)")
    parser.add_argument("--app-id", help=f"faust app id / consumer group (default: <prefix>-{role}, the one a "
                                         f"run's {role} joins)")
    parser.add_argument("--exit-when-idle", type=float, metavar="SECONDS", help=f"in-process driver: {idle_help}")


def processor_driver(args, command: str):
    """`faust` or `embedded`: the one asked for, else faust on Kafka; faust off Kafka ends the command."""
    from rollwire.core.errors import ConfigError
    from rollwire.streams.entry import choose_driver
    try:
        return choose_driver(bus_settings(args), args.driver)
    except ConfigError as exc:
        raise SystemExit(f"rollwire {command}: {exc}") from None


def serve_processor(args, serve, settings, command: str) -> int:
    """Runs a stream processor's front door (`serve_scorer`, `serve_joiner`) with the processor
    options of `add_processor_options` on the bus options' log; prints its counts when it stops
    in-process."""
    import json

    from rollwire.core.bus import catalog_topics, open_log
    from rollwire.schemas.topics import Topics
    topics, driver = Topics(args.prefix), processor_driver(args, command)
    log = open_log(bus_settings(args))
    try:
        log.create_topics(catalog_topics(topics))
        if driver == "faust":  # a faust worker keeps clients of its own: ours go before it starts
            log.close()
        stats = serve(log, topics, settings, bus=bus_settings(args), group_id=args.app_id, driver=driver,
                      stop_after_idle_s=args.exit_when_idle, loglevel="debug" if args.verbose else "warning")
    finally:
        if driver != "faust":
            log.close()
    if stats is not None:
        print(json.dumps(stats))
    return 0
