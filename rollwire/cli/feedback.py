"""Production traffic: `rollwire serve` (the serving gateway, with receipts), `rollwire feedback serve`
and `rollwire feedback import` (feedback onto the `feedback` topic)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rollwire.cli.options import (
    add_bus_options,
    add_command_group,
    add_processor_options,
    add_settings_flags,
    add_step,
    bus_settings,
    serve_processor,
    settings_flags,
    validated,
)

GATEWAY_FLAGS = ["upstream", "fleet", "policy", "model", "host", "port", "tokens_file", "record_fraction", "max_tokens",
                 "max_body_bytes"]
INGEST_FLAGS = ["host", "port", "tokens_file", "max_body_bytes", "max_batch_items", "max_pending", "ack_timeout_s"]

ITEM_HELP = """\
an item (JSON), the fields of `feedback.received` less those the server sets:
  {"feedback_id": "fb-1", "kind": "rating", "rating": 0.5, "response_id": "resp-…"}
  {"kind": "correction", "correction": "21", "messages": [{"role": "user", "content": "R:12>"}]}
  {"kind": "preference", "preferred_index": 1, "response_ids": ["resp-a", "resp-b"]}
kind is rating (in [-1, 1]), correction or preference; the judged response is a receipt
(response_id), or messages / token ids when it was served elsewhere; feedback_id makes a resend
harmless (the first result comes back, nothing is stored twice); source comes from the token."""


def add_serve(sub) -> None:
    serve = sub.add_parser(
        "serve", help="serve production apps (OpenAI-compatible), recording responses for feedback",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="An OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions, streamed or not,\n"
                    "/v1/models) in front of a vLLM server. Each response carries a receipt, its `id` and an\n"
                    "`x-rollwire-response-id` header, that feedback can name later; clients may send\n"
                    "`x-rollwire-conversation-id`. --record-fraction of the responses are recorded in tokens on\n"
                    "the `served` topic (prompt as rendered, sampled ids, logprobs, weight versions), so that\n"
                    "feedback on them can train without re-tokenizing anything.",
        epilog="examples:\n"
               "  rollwire serve --upstream http://127.0.0.1:8000 --log-dir runs/demo/log --prefix demo\n"
               "  rollwire serve --fleet --bus kafka --prefix prod      # replicas with --follow serving, canaries\n"
               "  ROLLWIRE_SERVE_TOKENS=chat-app=$TOKEN rollwire serve --bus kafka --host 0.0.0.0 --record-fraction 0.1\n\n"
               "  from openai import OpenAI\n"
               "  client = OpenAI(base_url=\"http://127.0.0.1:8350/v1\", api_key=TOKEN)\n"
               "  reply = client.chat.completions.with_raw_response.create(model=\"policy\", messages=[...])\n"
               "  receipt = reply.headers[\"x-rollwire-response-id\"]   # post feedback on it later")
    from rollwire.producers.gateway import GatewaySettings
    add_settings_flags(serve.add_argument_group("gateway (settings of rollwire.producers.gateway.GatewaySettings)"),
                       GatewaySettings, GATEWAY_FLAGS)
    add_bus_options(serve)
    serve.set_defaults(run=cmd_gateway)


def cmd_gateway(args: argparse.Namespace) -> int:
    from rollwire.producers.gateway import GatewaySettings, serve
    settings = validated(GatewaySettings, settings_flags(args, GATEWAY_FLAGS), "gateway", "serve")
    return _serve_on_log(args, serve, settings, f"serving {settings.model} on http://{settings.host}:{{port}}/v1")


def _serve_on_log(args: argparse.Namespace, serve, settings, banner: str) -> int:
    """Runs an HTTP service's `serve(log, topics, settings, ready=...)` on the bus options' log
    until interrupted; prints `banner` (with `{port}` filled in) once it listens."""
    from rollwire.core.bus import catalog_topics, open_log
    from rollwire.schemas.topics import Topics
    topics = Topics(args.prefix)
    with open_log(bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        try:
            serve(log, topics, settings, ready=lambda port: print(banner.format(port=port), flush=True))
        except KeyboardInterrupt:
            pass
    return 0


def add_join(sub) -> None:
    join = sub.add_parser(
        "join", help="run the feedback joiner: feedback joined with served responses into training samples",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Joins each `feedback.received` with the `response.served` record its receipt names,\n"
                    "whichever arrives first, into samples on `scored`:\n"
                    "  rating      a policy-gradient sample of the served tokens (the sampler's logprobs and\n"
                    "              weight versions kept), advantage = rating less the source's baseline\n"
                    "  correction  an SFT sample: the served prompt, then the correction rendered with the\n"
                    "              model's chat template (--tokenizer); prompt tokens are not trained\n"
                    "  preference  a pair for DPO: both receipts' served tokens, the chosen one first\n"
                    "Feedback whose responses never arrive within window_s, and what cannot train, go to\n"
                    "`drops` with the reason. Its state is on `joiner-state`: a restarted joiner loses\n"
                    "nothing and doubles nothing. On Kafka it runs as a faust worker (more workers with the\n"
                    "same --app-id split the receipts); in-process, one process holds them all.",
        epilog="settings file (TOML), all keys optional:\n"
               "  [joiner]\n  window_s = 3600\n  served_retention_s = 604800\n  baseline = \"source_mean\"   # or none\n"
               "  tokenizer = \"runs/demo/base\"   # the served model's, for corrections")
    join.add_argument("--config", type=Path, help="TOML file with a [joiner] table")
    join.add_argument("--tokenizer", metavar="DIR", help="the served model's tokenizer, to render corrections "
                                                         "(overrides [joiner] tokenizer)")
    add_processor_options(join, role="joiner", idle_help="stop when nothing arrived for SECONDS")
    add_bus_options(join)
    join.set_defaults(run=cmd_join)


def cmd_join(args: argparse.Namespace) -> int:
    from rollwire.cli.options import config_table
    from rollwire.streams.entry import serve_joiner
    from rollwire.streams.feedback_join import FeedbackJoinSettings
    table = config_table(args.config, "joiner", "join")
    if args.tokenizer:
        table["tokenizer"] = args.tokenizer
    return serve_processor(args, serve_joiner, validated(FeedbackJoinSettings, table, "joiner", "join"), "join")


def add_feedback(sub) -> None:
    commands = add_command_group(sub, "feedback", metavar="STEP",
                                 help="take production feedback in: an HTTP API, or a file",
                                 description="Feedback on served responses, stored as `feedback.received` events.")
    serve = add_step(
        commands, "serve", help="run the feedback ingestion API",
        description="Serves POST /v1/feedback (one item), POST /v1/feedback/batch (a JSON array or NDJSON,\n"
                    "a result per item) and GET /healthz. A 200 means the event log holds the item (Kafka\n"
                    "acks=all, or the embedded log's commit); 429 or 503 with Retry-After mean retry; 401/403\n"
                    "a token problem; 413 too large; 422 names the field and the reason.\n\n" + ITEM_HELP,
        epilog="examples:\n"
               "  rollwire feedback serve --log-dir runs/demo/log --prefix demo\n"
               "  ROLLWIRE_FEEDBACK_TOKENS=chat-app=$TOKEN rollwire feedback serve --bus kafka --host 0.0.0.0\n"
               "  curl -s localhost:8340/v1/feedback -H \"Authorization: Bearer $TOKEN\" \\\n"
               "       -d '{\"feedback_id\": \"fb-1\", \"kind\": \"rating\", \"rating\": 1, \"response_id\": \"resp-7\"}'\n\n"
               "tokens file: one `SOURCE TOKEN` pair a line; a token writes feedback of its source only.\n"
               "Without tokens the server listens on loopback only, and items name their source.")
    from rollwire.producers.feedback_api import FeedbackApiSettings
    add_settings_flags(serve.add_argument_group("ingestion (settings of rollwire.producers.feedback_api.FeedbackApiSettings)"),
                       FeedbackApiSettings, INGEST_FLAGS)
    add_bus_options(serve)
    serve.set_defaults(run=cmd_serve)

    load = add_step(
        commands, "import", help="store feedback from a JSON-lines file",
        description="Validates and stores every line of FILE as the API would, in group commits. A line\n"
                    "without a feedback_id gets one from its bytes, so importing the file again, after an\n"
                    "interruption say, stores nothing twice. Invalid lines are listed (and written to\n"
                    "FILE.rejected.jsonl with their errors); the others are stored.\n\n" + ITEM_HELP,
        epilog="example:\n  rollwire feedback import ratings.jsonl --source chat-app --log-dir runs/demo/log --prefix demo")
    load.add_argument("file", type=Path, help="JSON lines, one item each")
    load.add_argument("--source", required=True, help="the application the feedback comes from")
    add_bus_options(load)
    load.set_defaults(run=cmd_import)


def cmd_serve(args: argparse.Namespace) -> int:
    from rollwire.producers.feedback_api import FeedbackApiSettings, serve
    settings = validated(FeedbackApiSettings, settings_flags(args, INGEST_FLAGS), "ingest", "feedback serve")
    return _serve_on_log(args, serve, settings, f"feedback API on http://{settings.host}:{{port}}")


def cmd_import(args: argparse.Namespace) -> int:
    import asyncio

    from rich.console import Console
    from rich.progress import Progress

    from rollwire.core.bus import catalog_topics, open_log
    from rollwire.producers.feedback_api import FeedbackApiSettings, Ingest, import_id, submit_all
    from rollwire.schemas.topics import Topics
    if not args.file.is_file():
        raise SystemExit(f"rollwire feedback import: no such file {args.file}")
    lines = args.file.read_bytes().splitlines()
    topics = Topics(args.prefix)
    rejected: list[dict] = []
    counts = {"stored": 0, "duplicate": 0, "invalid": 0}
    with open_log(bus_settings(args)) as log:
        log.create_topics(catalog_topics(topics))
        ingest = Ingest(log, topics, FeedbackApiSettings(), name="feedback-import")
        ingest.load_seen()

        async def run(progress, task) -> None:
            await ingest.start()
            try:
                chunk = 500
                for start in range(0, len(lines), chunk):
                    items: list = []
                    numbers: list[int] = []
                    for number, line in enumerate(lines[start:start + chunk], start + 1):
                        if not line.strip():
                            continue
                        numbers.append(number)
                        try:
                            item = json.loads(line)
                        except ValueError as exc:
                            items.append(None)
                            rejected.append({"line": number, "errors": [{"loc": "", "msg": f"not JSON: {exc}"}]})
                            continue
                        if isinstance(item, dict) and "feedback_id" not in item:
                            item["feedback_id"] = import_id(line)
                        items.append(item)
                    valid = [(n, i) for n, i in zip(numbers, items) if i is not None]
                    for (number, _), result in zip(valid, await submit_all(ingest, [i for _, i in valid], args.source)):
                        if result["status"] in counts and result["status"] != "invalid":
                            counts[result["status"]] += 1
                        else:
                            rejected.append({"line": number, "errors": result["errors"]})
                    progress.update(task, completed=min(len(lines), start + chunk))
            finally:
                await ingest.close()

        with Progress(console=Console(stderr=True), transient=True) as progress:
            asyncio.run(run(progress, progress.add_task(f"importing {args.file.name}", total=len(lines))))
    counts["invalid"] = len(rejected)
    if rejected:
        out = args.file.with_name(args.file.name + ".rejected.jsonl")
        out.write_text("".join(json.dumps(r) + "\n" for r in rejected))
        for r in rejected[:10]:
            print(f"{args.file}:{r['line']}: " + "; ".join(f"{e['loc'] or 'item'}: {e['msg']}" for e in r["errors"]))
        print(f"{len(rejected)} lines rejected, written with their errors to {out}")
    print(json.dumps({"file": str(args.file), **counts}))
    return 0 if not rejected else 1
