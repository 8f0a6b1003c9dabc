"""Feedback ingestion: production apps post judgements of responses; each becomes a `feedback.received`
event, acknowledged only once the log holds it.

    POST /v1/feedback          one item (JSON object)          -> 200 {feedback_id, status}
    POST /v1/feedback/batch    a JSON array, or NDJSON         -> 200 {results: [...]} one per item
    GET  /healthz                                              -> 200 {status: "ok"}

    bearer token ──▶ its source          an item of another source: 403; no or unknown token: 401
    item ──validate──▶ FeedbackReceived  422 with the field path and the reason
    feedback_id seen before? ──yes──▶ the first result again (status "duplicate"), nothing written
    ──no──▶ queued ──group commit: send, flush──▶ 200 "stored"   (the log acknowledged it:
                                                                Kafka acks=all, embedded commit)
    queue full: 429, log unavailable: 503, both with Retry-After; never dropped silently

The item is the event's own schema (`schemas/feedback.py`) less the fields the server sets
(`type`, `received_at_ms`; `source` comes from the token). Idempotency spans restarts: on start the
server reads the ids already on the `feedback` topic. `rollwire feedback import FILE.jsonl` runs
the same `Ingest` over a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollwire.core import telemetry
from rollwire.core.bus import EventLog, EventProducer, records_to_end
from rollwire.core.http_service import Refused, check_exposure, load_tokens, read_body, read_json, refusals, run_app, source_of
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.topics import Topics

logger = logging.getLogger(__name__)

TOKENS_VARIABLE = "ROLLWIRE_FEEDBACK_TOKENS"
"""Bearer tokens from the environment: `SOURCE=TOKEN,SOURCE=TOKEN`."""

SERVER_SET = ("type", "received_at_ms", "traceparent")
"""Fields of the event the server fills in; an item that sets them is refused."""


class FeedbackApiSettings(BaseModel):
    """Settings of the feedback ingestion server."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to listen on; anything but loopback needs bearer tokens."""
    port: int = Field(default=8340, ge=0, le=65535)
    """Port (0: any free port)."""
    tokens_file: Path | None = None
    """Bearer tokens, one `SOURCE TOKEN` pair a line (`#` comments); also read from
    $ROLLWIRE_FEEDBACK_TOKENS as `SOURCE=TOKEN,SOURCE=TOKEN`. Without any, items name their source."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body; larger ones get 413."""
    max_batch_items: int = Field(default=1000, ge=1)
    """Most items in one batch request; more get 413."""
    max_pending: int = Field(default=20_000, ge=1)
    """Items accepted but not yet acknowledged by the log; past it requests get 429."""
    ack_timeout_s: float = Field(default=30.0, gt=0)
    """How long one group commit may wait for the log before its items get 503."""


class ItemError(ValueError):
    """An item that cannot become an event: `errors` are `{"loc": "field.path", "msg": reason}`."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" for e in errors))
        self.errors = errors


def to_event(item: Any, source: str | None) -> FeedbackReceived:
    """The event for one item; `ItemError` lists what is wrong, field by field. Raises
    `Refused(403)` for an item of another source than the token's."""
    if not isinstance(item, dict):
        raise ItemError([{"loc": "", "msg": f"an item is a JSON object, not {type(item).__name__}"}])
    errors = [{"loc": name, "msg": "set by the server; leave it out"} for name in SERVER_SET if name in item]
    if errors:
        raise ItemError(errors)
    if source is not None:
        if item.get("source", source) != source:
            raise Refused(403, f"this token writes feedback for source {source!r}, not {item['source']!r}")
        item = {**item, "source": source}
    try:
        return FeedbackReceived.model_validate(item)
    except ValidationError as exc:
        raise ItemError([{"loc": ".".join(map(str, e["loc"])), "msg": e["msg"]} for e in exc.errors()]) from None


@dataclass
class _Queued:
    event: FeedbackReceived
    done: asyncio.Future


class Ingest:
    """Validated feedback in, one event per new `feedback_id` on the `feedback` topic, answered only
    after the log acknowledged it. Writes are group-committed: the items waiting when a flush ends
    go out together in the next one."""

    def __init__(self, log: EventLog, topics: Topics, settings: FeedbackApiSettings, *, name: str = "feedback-api"):
        self.log, self.topics, self.settings = log, topics, settings
        self.producer = EventProducer(log.producer(), topics, name=name)
        self.results: dict[str, dict[str, Any]] = {}
        """The first result of every feedback id seen: on the log before start, or stored since."""
        self._inflight: dict[str, asyncio.Future] = {}
        self._queue: list[_Queued] = []
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task | None = None
        self.stats = {"stored": 0, "duplicate": 0, "invalid": 0, "refused": 0}

    def load_seen(self) -> int:
        """Reads the ids already on the `feedback` topic (payloads peeked, not validated)."""
        for record in records_to_end(self.log, [self.topics.feedback]):
            try:
                payload = msgpack.unpackb(record.value, raw=False)["payload"]
                feedback_id = payload["feedback_id"]
            except Exception:  # not our event: nothing to remember of it
                continue
            self.results.setdefault(feedback_id, {"feedback_id": feedback_id, "status": "stored"})
        return len(self.results)

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._writer = asyncio.create_task(self._write_loop(), name="feedback-writer")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        await asyncio.to_thread(self.producer.close)

    async def submit(self, event: FeedbackReceived) -> dict[str, Any]:
        """Stores `event` unless its id was seen; returns `{feedback_id, status}` once the log holds it.
        Raises `Refused(429)` when too much waits already, `Refused(503)` when the log failed."""
        return await self.enqueue(event)

    def enqueue(self, event: FeedbackReceived) -> asyncio.Future:
        """`submit` without waiting: a future of the result (already done for an id seen before)."""
        loop = asyncio.get_running_loop()
        first = self.results.get(event.feedback_id)
        if first is not None:
            self.stats["duplicate"] += 1
            done = loop.create_future()
            done.set_result({**first, "status": "duplicate"})
            return done
        pending = self._inflight.get(event.feedback_id)
        if pending is not None:  # the same id twice at once: one write, one "stored", the other "duplicate"
            self.stats["duplicate"] += 1
            again = loop.create_future()

            def follow(first: asyncio.Future) -> None:
                error = first.exception()
                if error is not None:
                    again.set_exception(error)
                else:
                    again.set_result({**first.result(), "status": "duplicate"})

            pending.add_done_callback(follow)
            return again
        if len(self._inflight) >= self.settings.max_pending:  # queued, or in the flush under way
            self.stats["refused"] += 1
            raise Refused(429, f"{self.settings.max_pending} items are waiting for the log: retry shortly",
                          {"Retry-After": "1"})
        done = loop.create_future()
        self._inflight[event.feedback_id] = done
        done.add_done_callback(lambda _: self._inflight.pop(event.feedback_id, None))
        self._queue.append(_Queued(event, done))
        assert self._wake is not None, "call start() first"
        self._wake.set()
        return done

    async def _write_loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queue = self._queue, []
            if not batch:
                continue
            try:
                await asyncio.wait_for(asyncio.to_thread(self._write, [q.event for q in batch]),
                                       self.settings.ack_timeout_s)
            except Exception as exc:  # the log did not acknowledge: the client retries, idempotently
                logger.warning("feedback write of %d items failed: %s", len(batch), exc)
                for q in batch:
                    if not q.done.done():
                        q.done.set_exception(Refused(503, f"the event log did not acknowledge the write: {exc}",
                                                     {"Retry-After": "2"}))
                continue
            for q in batch:
                result = {"feedback_id": q.event.feedback_id, "status": "stored"}
                self.results[q.event.feedback_id] = result
                self.stats["stored"] += 1
                if not q.done.done():
                    q.done.set_result(result)

    def _write(self, events: list[FeedbackReceived]) -> None:
        traced = telemetry.tracing()
        for event in events:
            if not traced:
                self.producer.send(self.topics.feedback, event, key=event.key)
                continue
            with telemetry.tracer().start_as_current_span(
                    "ingest feedback", attributes={"rollwire.feedback_id": event.feedback_id,
                                                   "rollwire.feedback.kind": event.kind,
                                                   "rollwire.feedback.source": event.source}):
                event = event.model_copy(update={"traceparent": telemetry.current_traceparent()})
                self.producer.send(self.topics.feedback, event, key=event.key)
        self.producer.flush(self.settings.ack_timeout_s)


def import_id(line: bytes) -> str:
    """The feedback id of a file line that carries none: the same line, the same id, so importing a
    file again (after an interruption, say) stores nothing twice."""
    return "import-" + hashlib.blake2b(line.strip(), digest_size=12).hexdigest()


def parse_batch(body: bytes, content_type: str) -> list[Any]:
    """The items of a batch body: a JSON array, or one JSON object a line (NDJSON)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(400, f"the body is not UTF-8 text: {exc}") from None
    if "ndjson" in content_type or "jsonl" in content_type or not text.lstrip().startswith("["):
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except ValueError as exc:
                    raise Refused(400, f"line {number} is not JSON: {exc}") from None
        return items
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    if not isinstance(items, list):
        raise Refused(400, "a batch is a JSON array of items, or NDJSON")
    return items


async def submit_all(ingest: Ingest, items: Iterable[Any], source: str | None) -> list[dict[str, Any]]:
    """Each item validated and submitted; a result per item, in order (invalid ones with their errors)."""
    results: list[dict[str, Any]] = []
    waiting: list[tuple[int, asyncio.Future]] = []
    for index, item in enumerate(items):
        try:
            waiting.append((index, ingest.enqueue(to_event(item, source))))
            results.append({"index": index})
        except ItemError as exc:
            ingest.stats["invalid"] += 1
            results.append({"index": index, "status": "invalid", "errors": exc.errors})
        except Refused as exc:
            status, loc = ("forbidden", "source") if exc.status == 403 else ("retry", "")
            results.append({"index": index, "status": status, "errors": [{"loc": loc, "msg": exc.reason}]})
    outcomes = await asyncio.gather(*(f for _, f in waiting), return_exceptions=True)
    for (index, _), outcome in zip(waiting, outcomes):
        if isinstance(outcome, Refused):
            results[index].update(status="retry", errors=[{"loc": "", "msg": outcome.reason}])
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            results[index].update(outcome)
    return results


def build_app(ingest: Ingest, tokens: Mapping[str, str]):
    """The aiohttp application: the routes of the module docstring over `ingest`."""
    from aiohttp import web

    settings = ingest.settings

    def error(status: int, reason: str, headers: Mapping[str, str] | None = None, **extra: Any) -> web.Response:
        return web.json_response({"error": reason, **extra}, status=status, headers=dict(headers or {}))

    async def one(request: web.Request) -> web.Response:
        source = source_of(request.headers.get("Authorization"), tokens)
        item = await read_json(request, settings.max_body_bytes)
        try:
            event = to_event(item, source)
        except ItemError as exc:
            ingest.stats["invalid"] += 1
            return error(422, "the item is not valid feedback", errors=exc.errors)
        return web.json_response(await ingest.submit(event))

    async def batch(request: web.Request) -> web.Response:
        source = source_of(request.headers.get("Authorization"), tokens)
        items = parse_batch(await read_body(request, settings.max_body_bytes), request.headers.get("Content-Type", ""))
        if len(items) > settings.max_batch_items:
            raise Refused(413, f"{len(items)} items in one batch; the limit is {settings.max_batch_items}")
        results = await submit_all(ingest, items, source)
        return web.json_response({"results": results,
                                  "counts": {s: sum(r["status"] == s for r in results)
                                             for s in ("stored", "duplicate", "invalid", "forbidden", "retry")}})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **ingest.stats})

    app = web.Application(middlewares=[refusals(lambda exc: error(exc.status, exc.reason, exc.headers))],
                          client_max_size=settings.max_body_bytes)
    app.add_routes([web.post("/v1/feedback", one), web.post("/v1/feedback/batch", batch),
                    web.get("/healthz", healthz)])

    async def lifecycle(app: web.Application):
        await ingest.start()
        yield
        await ingest.close()

    app.cleanup_ctx.append(lifecycle)
    return app


def serve(log: EventLog, topics: Topics, settings: FeedbackApiSettings, *, ready=None) -> None:
    """Runs the server until interrupted. `ready(port)` is called once it listens."""
    tokens = load_tokens(settings.tokens_file, TOKENS_VARIABLE)
    check_exposure(settings.host, tokens, "training data")
    ingest = Ingest(log, topics, settings)
    seen = ingest.load_seen()
    run_app(build_app(ingest, tokens), settings.host, settings.port, ready=ready,
            describe=lambda port: f"feedback API on http://{settings.host}:{port} ({seen} feedback ids already on "
                                  f"{topics.feedback}; " + (f"{len(tokens)} tokens)" if tokens else
                                                            "no tokens: items name their source)"))
