"""OpenTelemetry for rollwire: exporter setup, and trace context carried in record headers.

Messaging spans follow the OpenTelemetry conventions: `send <topic>` (PRODUCER) around each
produce, `process <topic>` (CONSUMER) around handling one record, with `messaging.*` attributes.
The W3C `traceparent` of the producing span travels in the record's headers; a consumer's
process span is its child. A batch (a trainer step) gets one span linked to every record's
context (`links_for`). A rollout's own context also travels inside its event (`traceparent`),
because the scorer emits its score later, from stored group state (`continued`).

One rollout's spans, across processes:

    env worker   rollout ─┬─ inference generate (each call)
                          └─ send rollouts
    scorer       process rollouts;  score rollout (child of the rollout) ─ send scored
    trainer      trainer step (linked to each scored record) ─ publish weights ─ send weights
    replica      process weights ─ reload weights
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pydantic import BaseModel, ConfigDict, Field

from rollwire.core.errors import ConfigError
from rollwire.core.memory_sites import MemorySitesSettings
from rollwire.core.metrics import MetricsSettings
from rollwire.core.trackers import MLflowSettings, TensorBoardSettings, TrackerName, TrackioSettings, WandbSettings

TRACER_NAME = "rollwire"
_propagator = TraceContextTextMapPropagator()


class TelemetrySettings(BaseModel):
    """Where spans go (`exporter`), where metrics go (`[telemetry.metrics]`, `rollwire.core.metrics`),
    and which trackers get each trainer step (`report_to`, `rollwire.core.trackers`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    exporter: Literal["none", "console", "file", "otlp"] = "none"
    """`file` writes JSON lines to `file_path`; `otlp` sends to `otlp_endpoint` (needs the
    `otlp` extra); `console` prints spans; `none` records nothing."""
    file_path: Path | None = None
    """Span file for the `file` exporter."""
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    """OTLP/HTTP traces endpoint: a collector, or Jaeger v2 itself (the compose stack's, on 127.0.0.1:4318)."""
    service_name: str = "rollwire"
    """`service.name` resource attribute: the component, e.g. `trainer`."""
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    """OpenTelemetry metrics: consumer lag, rollouts, staleness, reload time, in-flight (`rollwire.core.metrics`)."""
    report_to: list[TrackerName] = Field(default_factory=list)
    """Trackers that get every trainer step's metrics: `tensorboard`, `mlflow`, `wandb`, `trackio`."""
    tensorboard: TensorBoardSettings = Field(default_factory=TensorBoardSettings)
    """For `report_to = ["tensorboard"]`."""
    mlflow: MLflowSettings = Field(default_factory=MLflowSettings)
    """For `report_to = ["mlflow"]`."""
    wandb: WandbSettings = Field(default_factory=WandbSettings)
    """For `report_to = ["wandb"]` (the `wandb` extra)."""
    trackio: TrackioSettings = Field(default_factory=TrackioSettings)
    """For `report_to = ["trackio"]` (the `trackio` extra)."""
    memory_sites: MemorySitesSettings = Field(default_factory=MemorySitesSettings)
    """Where each component's memory grows, by allocation site (`rollwire.core.memory_sites`; off by default)."""


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def configure(settings: TelemetrySettings) -> TracerProvider | None:
    """Installs a tracer provider with the configured exporter (once per process)."""
    if settings.exporter == "none":
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    if settings.exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif settings.exporter == "file":
        if settings.file_path is None:
            raise ConfigError("telemetry.exporter = 'file' needs telemetry.file_path")
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(settings.file_path)))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError("telemetry.exporter = 'otlp' needs the OTLP exporter: "
                              "pip install 'rollwire[otlp]'") from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
    trace.set_tracer_provider(provider)
    return provider


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span as one JSON object per line (safe for several processes)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_to_dict(s)) + "\n" for s in spans)
        with self._lock, open(self.path, "a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def span_to_dict(span: ReadableSpan) -> dict:
    """A span as plain data: ids in hex, attributes, links, kind and times (ns)."""
    ctx = span.get_span_context()
    assert ctx is not None, "a finished span has a context"
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "links": [{"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
                  for link in span.links],
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "service": (span.resource.attributes or {}).get("service.name"),
    }


def current_traceparent() -> str | None:
    """The W3C traceparent of the active span, or None outside any recorded span."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None  # the propagator would write nothing: skip building its carrier
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def context_from_headers(headers: Sequence[tuple[str, bytes]]) -> otel_context.Context:
    """The trace context a producer put in a record's headers (empty context if none)."""
    carrier = {k: v.decode("latin-1") for k, v in headers if k in ("traceparent", "tracestate")}
    return _propagator.extract(carrier)


def tracing() -> bool:
    """Whether this process records spans (a tracer provider is installed). Without one every
    span is a no-op, so the helpers below skip building them: per-record work on the hot path.
    (`get_tracer_provider()` looks at the environment on every call until a provider is set, so
    the installed provider is read directly where the API has it.)"""
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return provider is not None


_UNKNOWN = object()


@contextmanager
def send_span(topic: str, key: bytes | None, event_type: str) -> Iterator[trace.Span]:
    """A PRODUCER span `send <topic>`; headers written inside it carry its context."""
    if not tracing():
        yield trace.INVALID_SPAN
        return
    attributes = {"messaging.system": "kafka", "messaging.operation.type": "send",
                  "messaging.destination.name": topic, "rollwire.event.type": event_type}
    if key is not None:
        attributes["messaging.kafka.message.key"] = key.decode("utf-8", "replace")
    with tracer().start_as_current_span(f"send {topic}", kind=SpanKind.PRODUCER,
                                        attributes=attributes) as span:
        yield span


@contextmanager
def process_span(topic: str, partition: int, offset: int, headers: Sequence[tuple[str, bytes]],
                 group: str | None = None, **attributes: str | int | float) -> Iterator[trace.Span]:
    """A CONSUMER span `process <topic>`, child of the producer's context in `headers`."""
    if not tracing():
        yield trace.INVALID_SPAN
        return
    attrs: dict = {"messaging.system": "kafka", "messaging.operation.type": "process",
                   "messaging.destination.name": topic,
                   "messaging.destination.partition.id": str(partition),
                   "messaging.kafka.offset": offset, **attributes}
    if group:
        attrs["messaging.consumer.group.name"] = group
    with tracer().start_as_current_span(f"process {topic}", context=context_from_headers(headers),
                                        kind=SpanKind.CONSUMER, attributes=attrs) as span:
        yield span


def context_from_traceparent(traceparent: str | None) -> otel_context.Context:
    """The context a stored W3C traceparent names (empty context for None)."""
    return _propagator.extract({"traceparent": traceparent} if traceparent else {})


@contextmanager
def continued(traceparent: str | None) -> Iterator[None]:
    """Makes the span a stored traceparent names the current parent (no new span); no-op for None."""
    if traceparent is None:
        yield
        return
    token = otel_context.attach(context_from_traceparent(traceparent))
    try:
        yield
    finally:
        otel_context.detach(token)


def links_for(headers_list: Sequence[Sequence[tuple[str, bytes]]]) -> list[Link]:
    """One link per record whose headers carry a valid trace context (for batch spans)."""
    links = []
    for headers in headers_list:
        span_context = trace.get_current_span(context_from_headers(headers)).get_span_context()
        if span_context.is_valid:
            links.append(Link(span_context))
    return links


def links_to(traceparents: Sequence[str | None]) -> list[Link]:
    """One link per stored W3C traceparent that names a valid span (None and malformed ones skipped)."""
    links = []
    for traceparent in traceparents:
        span_context = trace.get_current_span(context_from_traceparent(traceparent)).get_span_context()
        if traceparent and span_context.is_valid:
            links.append(Link(span_context))
    return links
