"""`rollwire topics` and `rollwire tail`: the catalog, and reading a topic."""

from __future__ import annotations

import argparse
import json
import re
import time

from rollwire.cli.options import add_bus_options, bus_settings


def add_topics(sub) -> None:
    topics = sub.add_parser("topics", help="show the topic catalog, or create its topics on a log",
                            description="Shows every topic of the loop: the events it carries, its "
                                        "key, partitions, cleanup, producer and consumer.")
    topics.add_argument("--markdown", action="store_true", help="print the README's markdown table")
    topics.add_argument("--create", action="store_true",
                        help="create the catalog's topics on the chosen log (existing ones are kept)")
    add_bus_options(topics)
    topics.set_defaults(run=cmd_topics)


def add_tail(sub) -> None:
    tail = sub.add_parser("tail", help="print the events of a topic as JSON lines",
                          description="Prints decoded events (envelope and payload) from a topic. "
                                      "Records that do not decode are printed with their error.")
    tail.add_argument("topic", help="short name (rollouts) or full name (rollwire.rollouts)")
    start = tail.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the first record (default)")
    start.add_argument("--since", metavar="AGE", help="start at records newer than AGE, e.g. 90s, 10m, 2h")
    tail.add_argument("--limit", type=int, default=None, help="stop after N events")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new events (Ctrl-C stops)")
    add_bus_options(tail)
    tail.set_defaults(run=cmd_tail)


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
        with open_log(bus_settings(args)) as log:
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
    with open_log(bus_settings(args)) as log, log.reader([topic], start) as reader:
        try:
            while args.limit is None or printed < args.limit:
                batch = reader.poll_batch(100, 1.0)
                if not batch and not args.follow:
                    break
                for record in batch[: None if args.limit is None else args.limit - printed]:
                    line: dict[str, object] = {"partition": record.partition, "offset": record.offset}
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
