"""`rollwire topics` and `rollwire tail`: the catalog, and reading a topic."""

from __future__ import annotations

import argparse
import json
import re
import time

from rollwire.cli.options import add_bus_options, add_run_options, bus_settings, recorded_run


def add_topics(sub) -> None:
    topics = sub.add_parser("topics", help="show the topic catalog, or create its topics on a log",
                            description="Shows every topic of the loop: the events it carries, its "
                                        "key, partitions, cleanup, producer and consumer.")
    topics.add_argument("--markdown", action="store_true", help="print the catalog as a markdown table (as the docs' topic page)")
    topics.add_argument("--create", action="store_true",
                        help="create the catalog's topics on the chosen log (existing ones are kept)")
    add_bus_options(topics)
    topics.set_defaults(run=cmd_topics)


def add_tail(sub) -> None:
    tail = sub.add_parser("tail", help="print the events of a topic, filtered, as lines or JSON",
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          description="Prints decoded events from a topic: one line each, or with --json one JSON\n"
                                      "object each (envelope and payload; bytes as base64) to pipe into jq. Records\n"
                                      "that do not decode are printed with their error. Without --follow it stops\n"
                                      "at the end the topic had when it started.",
                          epilog="examples:\n"
                                 "  rollwire tail rollouts --run-dir runs/demo --where group_id=g3\n"
                                 "  rollwire tail rollouts --log-dir runs/demo/log --prefix demo --where group_id=g3\n"
                                 "  rollwire tail scored --prefix demo --where rollout.environment=reverse-digits --json"
                                 " | jq .event.advantage\n"
                                 "  rollwire tail deadletter --bus kafka --prefix run7 --since 1h\n"
                                 "  rollwire tail drops --type rollouts.dropped --where reason=stale --follow")
    tail.add_argument("topic", help="short name (rollouts) or full name (rollwire.rollouts)")
    start = tail.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the first record (default)")
    start.add_argument("--since", metavar="AGE", help="start at records newer than AGE, e.g. 90s, 10m, 2h")
    tail.add_argument("--limit", type=int, default=None, help="stop after N events")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new events (Ctrl-C stops)")
    tail.add_argument("--type", action="append", default=[], metavar="TYPE",
                      help="only events of this type tag, e.g. rollout.completed (repeatable)")
    tail.add_argument("--where", action="append", default=[], metavar="FIELD=VALUE",
                      help="only events whose payload FIELD (dotted: rollout.group_id) equals VALUE (repeatable)")
    tail.add_argument("--json", action="store_true", help="one JSON object a line (envelope and payload)")
    add_run_options(tail)
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
        from rollwire.core.bus import catalog_topics, open_log
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


def _where(values: list[str]) -> list[tuple[list[str], str]]:
    out = []
    for value in values:
        field, sep, expected = value.partition("=")
        if not sep or not field:
            raise SystemExit(f"rollwire: --where {value!r} is not FIELD=VALUE, e.g. --where rollout.group_id=g3")
        out.append((field.split("."), expected))
    return out


def _matches(payload: dict, conditions: list[tuple[list[str], str]]) -> bool:
    for path, expected in conditions:
        value: object = payload
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is None and expected not in ("None", "null"):
            return False
        if isinstance(value, bool) or not isinstance(value, int | float):
            if str(value) != expected and json.dumps(value) != expected:
                return False
            continue
        try:
            if float(expected) != float(value):
                return False
        except ValueError:
            return False
    return True


def _summary(line: dict, width: int) -> str:
    where = f"p{line['partition']}@{line['offset']}"
    if "tombstone" in line:
        return f"{where:<10} tombstone key={line['tombstone']}"
    if "error" in line:
        return f"{where:<10} undecodable ({line['size']} B): {line['error']}"
    fields = [(k, v) for k, v in line["event"].items() if k != "type"]  # scalars first: they fit the line
    body = json.dumps(dict(sorted(fields, key=lambda kv: isinstance(kv[1], dict | list))), separators=(",", ":"))
    text = f"{where:<10} {line['type']:<22} {body}"
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_tail(args: argparse.Namespace) -> int:
    import shutil

    from rollwire.core.bus import AtTime, Beginning, open_log
    from rollwire.schemas import Codec, SchemaError
    _, bus, prefix = recorded_run(args)
    topic = args.topic if "." in args.topic else f"{prefix}.{args.topic}"
    start = AtTime(time.time_ns() // 1_000_000 - _age_ms(args.since)) if args.since else Beginning()
    conditions, types = _where(args.where), set(args.type)
    width = shutil.get_terminal_size((160, 24)).columns
    codec, printed = Codec(), 0
    with open_log(bus) as log:
        ends = log.end_offsets(topic)
        reached: dict[int, int] = {}  # partition -> offset after the last record read
        with log.reader([topic], start) as reader:
            try:
                quiet_since = time.monotonic()
                while args.limit is None or printed < args.limit:
                    batch = reader.poll_batch(100, 1.0)
                    if batch:
                        quiet_since = time.monotonic()
                    elif not args.follow and (isinstance(start, AtTime) or time.monotonic() - quiet_since > 5):
                        # Read from the beginning, the end offsets seen at start end the read (below);
                        # with --since a partition may hold nothing newer, and a compacted topic may
                        # have lost its last offsets, so a quiet log ends it too.
                        break
                    for record in batch:
                        reached[record.partition] = max(reached.get(record.partition, 0), record.offset + 1)
                        if args.limit is not None and printed >= args.limit:
                            break
                        line: dict[str, object] = {"partition": record.partition, "offset": record.offset}
                        if record.value is None:
                            line["tombstone"] = (record.key or b"").decode("utf-8", "replace")
                        else:
                            try:
                                env = codec.decode(record.value)
                                line |= {"type": env.type, "event_id": env.event_id, "producer": env.producer,
                                         "produced_at_ms": env.produced_at_ms,
                                         "event": env.event.model_dump(mode="json")}
                            except SchemaError as exc:
                                line |= {"error": f"{type(exc).__name__}: {exc}", "size": len(record.value)}
                        if (types or conditions) and ("event" not in line or (types and line["type"] not in types)
                                                      or not _matches(line["event"], conditions)):  # type: ignore[arg-type]
                            continue
                        print(json.dumps(line) if args.json else _summary(line, width), flush=True)
                        printed += 1
                    if not args.follow and all(reached.get(p, 0) >= end for p, end in ends.items()):
                        break
            except KeyboardInterrupt:
                pass
    return 0
