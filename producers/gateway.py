"""The serving gateway (`rollwire serve`): an OpenAI-compatible endpoint for production apps in front
of the fleet, recording what it serves in tokens so that feedback on it can become training data.

    POST /v1/chat/completions   {messages, max_tokens, temperature, stream}  ─┐
    POST /v1/completions        {prompt, max_tokens, temperature, stream}    ─┤ bearer token ─▶ source
                                                                               ▼
        render and tokenize on the server, generate token-in/token-out (the env workers' own
        interception path: `producers/interception.py`), decode the sampled ids for the client
                                                                               │
        ◀── the response, its receipt as `id` and `x-rollwire-response-id` ────┤
                                                                               ▼
        record_fraction of responses ──response.served──▶ served (key: x-rollwire-conversation-id,
                                                                 else the receipt)
    GET /v1/models, GET /healthz

Recording never delays a response: records are group-committed behind it, and one the log does
not take is counted and logged, not retried. Sampling settings are the client's (`max_tokens`,
`temperature`); the weights are whatever the fleet serves, and the record says which version
sampled which tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollwire.consumers.vllm_control import VllmControl, VllmError
from rollwire.core import telemetry
from rollwire.core.bus import EventLog, EventProducer
from rollwire.core.http_service import Refused, check_exposure, load_tokens, read_json, refusals, run_app, source_of
from rollwire.producers.interception import Interceptor, recorded_call, shown_ids
from rollwire.producers.releases import ServingPlan
from rollwire.producers.routing import FleetView, RolloutRoute, Router
from rollwire.schemas.base import new_id
from rollwire.schemas.rollout import InferenceCall, SamplingParams
from rollwire.schemas.serving import Endpoint, ResponseServed
from rollwire.schemas.topics import Topics

logger = logging.getLogger(__name__)

TOKENS_VARIABLE = "ROLLWIRE_SERVE_TOKENS"
"""Bearer tokens from the environment: `SOURCE=TOKEN,SOURCE=TOKEN`."""
RECEIPT_HEADER = "x-rollwire-response-id"
CONVERSATION_HEADER = "x-rollwire-conversation-id"


class GatewaySettings(BaseModel):
    """Settings of the serving gateway."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    upstream: str = "http://127.0.0.1:8000"
    """The vLLM server it serves from (a replica of `rollwire inference`, or `rollwire run`'s), unless `fleet`."""
    fleet: bool = False
    """Serve from every replica reporting on `fleet` instead of `upstream`: each request goes to the
    version the serving decisions give it (`rollwire promote --canary`: the canary's share of requests
    to the canary, the rest to the stable version), then to the least loaded replica serving it."""
    policy: str = "policy"
    """Policy whose serving decisions the gateway follows (with `fleet`)."""
    model: str = "policy"
    """The model name clients ask for (the upstream's served name)."""
    host: str = "127.0.0.1"
    """Address to listen on; anything but loopback needs bearer tokens."""
    port: int = Field(default=8350, ge=0, le=65535)
    """Port (0: any free port)."""
    tokens_file: Path | None = None
    """Bearer tokens, `SOURCE TOKEN` a line; also $ROLLWIRE_SERVE_TOKENS. Without any, every request
    is source `anonymous` and only loopback is served."""
    record_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of responses recorded on `served` (chosen at random); feedback on the others cannot train."""
    max_tokens: int = Field(default=256, ge=1)
    """`max_tokens` when a request gives none; also the most a request may ask for."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body; larger ones get 413."""


class Recorder:
    """`response.served` events written behind the responses: group-committed by a background
    thread, never waited for by a request."""

    def __init__(self, log: EventLog, topics: Topics) -> None:
        self.topics = topics
        self.producer = EventProducer(log.producer(), topics, name="serving-gateway")
        self.recorded = self.lost = 0
        self._pending: list[ResponseServed] = []
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="served-recorder", daemon=True)
        self._thread.start()

    def record(self, event: ResponseServed) -> None:
        with self._lock:
            self._pending.append(event)
            self._lock.notify()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                batch, self._pending = self._pending, []
                if not batch and self._closed:
                    return
            try:
                for event in batch:
                    self.producer.send(self.topics.served, event, key=event.key)
                self.producer.flush()
                self.recorded += len(batch)
            except Exception as exc:  # a record lost costs training data, never a response
                self.lost += len(batch)
                logger.warning("%d served responses were not recorded: %s", len(batch), exc)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=30)
        self.producer.close()


def _sampling(body: Mapping[str, Any], settings: GatewaySettings) -> SamplingParams:
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens")) or settings.max_tokens
    temperature = body.get("temperature", 1.0)
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= settings.max_tokens:
        raise Refused(422, f"max_tokens must be an integer in 1..{settings.max_tokens}, got {max_tokens!r}")
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise Refused(422, f"temperature must be a number in [0, 2], got {temperature!r}")
    return SamplingParams(max_tokens=max_tokens, temperature=float(temperature))


def _messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused(422, "messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise Refused(422, f"messages[{i}] must be an object with a string role and a string content")
        out.append({"role": m["role"], "content": m["content"]})
    return out


class Gateway:
    """Serves one request at a time per call; thread-safe (every vLLM call runs in a worker thread)."""

    def __init__(self, log: EventLog, topics: Topics, settings: GatewaySettings, *,
                 control: VllmControl | None = None, router: Router | None = None, plan: ServingPlan | None = None,
                 rng: random.Random | None = None) -> None:
        self.settings = settings
        if router is None and settings.fleet and control is None:
            router = Router(FleetView()).follow(log, topics)
            plan = ServingPlan(settings.policy).follow(log, topics)
        self.router = router or Router.single(control or VllmControl(settings.upstream))
        """Where requests go: one upstream, or the fleet by the serving decisions (`plan`)."""
        self.plan = plan
        self.recorder = Recorder(log, topics)
        self._rng = rng or random.Random()
        self._end_of_turn: list[int] | None = None

    def route(self) -> RolloutRoute:
        """One request's way to a replica: the version the serving plan picks for it, if any."""
        return self.router.route(self.plan.pick(self._rng) if self.plan is not None else None)

    def end_of_turn(self, route: RolloutRoute) -> list[int]:
        """The served template's end-of-turn token (`VllmControl.end_of_turn_ids`), asked once."""
        if self._end_of_turn is None:
            self._end_of_turn = route.end_of_turn_ids(self.settings.model)
        return self._end_of_turn

    def healthy(self) -> bool:
        """Whether any replica it routes to answers."""
        return any(member.control.healthy() for member in self.router.fleet.members())

    def _record(self, *, response_id: str, source: str, conversation_id: str | None, endpoint: Endpoint,
                call: InferenceCall, completion: str, messages: list[dict[str, str]] | None = None,
                prompt: str | None = None) -> None:
        if self._rng.random() >= self.settings.record_fraction:
            return
        self.recorder.record(ResponseServed(
            response_id=response_id, conversation_id=conversation_id, source=source, endpoint=endpoint,
            model=self.settings.model, messages=messages or [], prompt=prompt, call=call, completion=completion,
            traceparent=telemetry.current_traceparent()))

    async def complete(self, body: Mapping[str, Any], *, chat: bool, source: str,
                       conversation_id: str | None) -> tuple[str, dict[str, Any]]:
        """A whole response: `(receipt, OpenAI response body)`."""
        sampling = _sampling(body, self.settings)
        response_id = f"resp-{new_id()}"
        interceptor = Interceptor(self.route(), sampling, model=self.settings.model)
        try:
            if chat:
                messages = _messages(body)
                text = await asyncio.to_thread(interceptor.chat, messages)
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise Refused(422, "prompt must be a string")
                text = await asyncio.to_thread(interceptor.complete, prompt)
        except VllmError as exc:
            raise Refused(502, f"the model server failed: {exc}") from None
        call = interceptor.calls[-1]
        self._record(response_id=response_id, source=source, conversation_id=conversation_id,
                     endpoint="chat" if chat else "completion", call=call, completion=text,
                     messages=messages if chat else None, prompt=None if chat else prompt)
        usage = {"prompt_tokens": len(call.prompt_token_ids), "completion_tokens": len(call.completion_token_ids),
                 "total_tokens": len(call.prompt_token_ids) + len(call.completion_token_ids)}
        choice: dict[str, Any] = {"index": 0, "finish_reason": call.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return response_id, {"id": response_id, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": self.settings.model, "choices": [choice],
                             "usage": usage}

    async def stream(self, body: Mapping[str, Any], *, chat: bool, source: str,
                     conversation_id: str | None) -> tuple[str, AsyncIterator[dict[str, Any]]]:
        """A streamed response: `(receipt, chunks)`; the record is written after the last chunk."""
        sampling = _sampling(body, self.settings)
        response_id = f"resp-{new_id()}"
        messages = _messages(body) if chat else None
        prompt = None if chat else body.get("prompt")
        if not chat and not isinstance(prompt, str):
            raise Refused(422, "prompt must be a string")
        route = self.route()
        try:
            if chat:
                prompt_ids = await asyncio.to_thread(route.render_chat, messages or [], model=self.settings.model)
                stop = await asyncio.to_thread(self.end_of_turn, route)
            else:
                prompt_ids, stop = await asyncio.to_thread(route.tokenize, prompt or ""), []
        except VllmError as exc:
            raise Refused(502, f"the model server failed: {exc}") from None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict | BaseException | None] = asyncio.Queue()

        def pump() -> None:  # the upstream stream, read in a thread, handed to the event loop
            try:
                for chunk in route.generate_stream(prompt_ids, max_tokens=sampling.max_tokens,
                                                          temperature=sampling.temperature, model=self.settings.model,
                                                          stop_token_ids=stop):
                    loop.call_soon_threadsafe(queue.put_nowait, chunk)
            except BaseException as exc:  # handed to the response, which ends with it
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            started = time.perf_counter()
            threading.Thread(target=pump, name=f"stream-{response_id}", daemon=True).start()
            joined: dict[str, Any] = {"token_ids": [], "logprobs": {"content": []}}
            text = ""
            kind = "chat.completion.chunk" if chat else "text_completion"
            if chat:
                yield self._chunk(response_id, kind, {"delta": {"role": "assistant", "content": ""}})
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                choice = item["choices"][0]
                joined["token_ids"] += choice.get("token_ids") or []
                joined["logprobs"]["content"] += (choice.get("logprobs") or {}).get("content") or []
                for name in ("finish_reason", "stop_reason", "weight_versions"):
                    if choice.get(name) is not None:
                        joined[name] = choice[name]
                shown = shown_ids(joined, stop) if joined.get("finish_reason") else joined["token_ids"]
                now = await asyncio.to_thread(route.detokenize, shown) if shown else ""
                delta, text = now[len(text):], now
                if delta or joined.get("finish_reason"):
                    part: dict[str, Any] = ({"delta": {"content": delta}} if chat else {"text": delta})
                    yield self._chunk(response_id, kind, {**part, "finish_reason": joined.get("finish_reason")})
            self._record(response_id=response_id, source=source, conversation_id=conversation_id,
                         endpoint="chat" if chat else "completion",
                         call=recorded_call(prompt_ids, joined, time.perf_counter() - started), completion=text,
                         messages=messages, prompt=prompt)

        return response_id, chunks()

    def _chunk(self, response_id: str, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": response_id, "object": kind, "created": int(time.time()), "model": self.settings.model,
                "choices": [{"index": 0, "logprobs": None, **choice}]}

    def close(self) -> None:
        self.recorder.close()
        if self.plan is not None:
            self.plan.close()
        self.router.close()


def build_app(gateway: Gateway, tokens: Mapping[str, str]):
    """The aiohttp application of the module docstring's routes."""
    from aiohttp import web

    settings = gateway.settings

    def openai_error(exc: Refused) -> web.Response:
        return web.json_response({"error": {"message": exc.reason, "type": "invalid_request_error", "code": exc.status}},
                                 status=exc.status, headers=exc.headers)

    async def body_of(request: web.Request) -> dict[str, Any]:
        body = await read_json(request, settings.max_body_bytes)
        if not isinstance(body, dict):
            raise Refused(400, "the body must be a JSON object")
        if body.get("model", settings.model) != settings.model:
            raise Refused(404, f"model {body['model']!r} is not served here; this gateway serves {settings.model!r}")
        return body

    def handler(chat: bool):
        async def handle(request: web.Request) -> web.StreamResponse:
            source = source_of(request.headers.get("Authorization"), tokens) or "anonymous"
            body = await body_of(request)
            conversation_id = request.headers.get(CONVERSATION_HEADER)
            with telemetry.tracer().start_as_current_span(
                    "serve " + ("chat" if chat else "completion"),
                    attributes={"rollwire.source": source, "gen_ai.request.model": settings.model}):
                if not body.get("stream"):
                    receipt, answer = await gateway.complete(body, chat=chat, source=source,
                                                             conversation_id=conversation_id)
                    return web.json_response(answer, headers={RECEIPT_HEADER: receipt})
                receipt, chunks = await gateway.stream(body, chat=chat, source=source, conversation_id=conversation_id)
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                       RECEIPT_HEADER: receipt})
                await response.prepare(request)
                try:
                    async for chunk in chunks:
                        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                except VllmError as exc:
                    error = {"error": {"message": f"the model server failed: {exc}", "code": 502}}
                    await response.write(f"data: {json.dumps(error)}\n\n".encode())
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                return response
        return handle

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": settings.model, "object": "model",
                                                               "owned_by": "rollwire"}]})

    async def healthz(request: web.Request) -> web.Response:
        healthy = await asyncio.to_thread(gateway.healthy)
        return web.json_response({"status": "ok" if healthy else "upstream down", "recorded": gateway.recorder.recorded,
                                  "lost": gateway.recorder.lost}, status=200 if healthy else 503)

    app = web.Application(middlewares=[refusals(openai_error)], client_max_size=settings.max_body_bytes)
    app.add_routes([web.post("/v1/chat/completions", handler(chat=True)), web.post("/v1/completions", handler(chat=False)),
                    web.get("/v1/models", models), web.get("/healthz", healthz)])
    return app


def serve(log: EventLog, topics: Topics, settings: GatewaySettings, *, ready=None) -> None:
    """Runs the gateway until interrupted; `ready(port)` is called once it listens."""
    tokens = load_tokens(settings.tokens_file, TOKENS_VARIABLE)
    check_exposure(settings.host, tokens, "the model")
    gateway = Gateway(log, topics, settings)
    try:
        run_app(build_app(gateway, tokens), settings.host, settings.port, ready=ready,
                describe=lambda port: f"serving {settings.model} from "
                                      f"{'the fleet, by serving decisions,' if settings.fleet else settings.upstream} on http://{settings.host}:"
                                      f"{port}, recording {100 * settings.record_fraction:.0f}% of responses on "
                                      f"{topics.served}")
    finally:
        with contextlib.suppress(Exception):
            gateway.close()
