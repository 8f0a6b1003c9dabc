"""OpenTelemetry metrics: what an operator (or an autoscaler) watches beside the traces.

    rollwire.consumer.lag            gauge      records not yet consumed, per consumer group and topic
    rollwire.rollouts                counter    rollouts published by env workers, per environment and outcome
    rollwire.rollout.staleness       histogram  policy versions between sampling and training, per trained rollout
    rollwire.trainer.step.duration   histogram  seconds per trainer step (batch wait excluded)
    rollwire.weights.reload.duration histogram  seconds from a version's event to serving it, per replica
    rollwire.replica.in_flight       gauge      requests an env worker has open on each replica

**Lag is the signal to scale on.** `rollwire.consumer.lag{messaging.consumer.group.name=<prefix>-env-worker,
messaging.destination.name=<prefix>.tasks}` growing means tasks wait for env workers (add workers,
or replicas if their `in_flight` is high); lag on `rollouts` for the scorer's group means the
scorer falls behind (add partitions and scorer instances); the trainer's lag on `scored` growing
while staleness drops are counted means the trainer is the bottleneck. A Kubernetes HPA or KEDA
reads exactly this gauge through an OTLP collector's Prometheus exporter.

Group lag comes from the log itself (`LagProbe`: end offsets minus the group's committed offsets),
so one process observes every group; the trainer, which keeps its read positions in its checkpoint
rather than in a group, reports its own lag on `scored` as group `trainer`.

Each process exports on its own (`configure`); `[telemetry.metrics] exporter` picks where:
`otlp` (an OTLP/HTTP metrics endpoint: a collector, Prometheus with its OTLP receiver), `file`
(JSON lines, one data point per line), `console`, or `none` (every instrument is then a no-op).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from pydantic import BaseModel, ConfigDict, Field

from rollwire.core.errors import ConfigError

logger = logging.getLogger(__name__)

METER_NAME = "rollwire"
GROUP = "messaging.consumer.group.name"
TOPIC = "messaging.destination.name"


class MetricsSettings(BaseModel):
    """Where metrics go (`[telemetry.metrics]`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    exporter: Literal["none", "console", "file", "otlp"] = "none"
    """`otlp` sends to `otlp_endpoint` (needs the `otlp` extra); `file` appends JSON lines to
    `file_path`; `console` prints; `none` records nothing."""
    file_path: Path | None = None
    """Metrics file for the `file` exporter (in a run: `<run_dir>/metrics-otel.jsonl` by default)."""
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/metrics"
    """OTLP/HTTP metrics endpoint. Jaeger takes traces only: point this at a collector."""
    interval_s: float = Field(default=10.0, gt=0)
    """Seconds between exports (and between lag reads, which cost one offsets query per topic)."""


def meter() -> metrics.Meter:
    return metrics.get_meter(METER_NAME)


def configure(settings: MetricsSettings, service_name: str) -> MeterProvider | None:
    """Installs a meter provider exporting every `interval_s` (once per process); None for `none`."""
    if settings.exporter == "none":
        return None
    exporter: MetricExporter
    if settings.exporter == "console":
        exporter = ConsoleMetricExporter()
    elif settings.exporter == "file":
        if settings.file_path is None:
            raise ConfigError("telemetry.metrics.exporter = 'file' needs telemetry.metrics.file_path")
        exporter = JsonLinesMetricExporter(settings.file_path)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError as exc:
            raise ConfigError("telemetry.metrics.exporter = 'otlp' needs the OTLP exporter: "
                              "pip install 'rollwire[otlp]'") from exc
        exporter = OTLPMetricExporter(endpoint=settings.otlp_endpoint)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=settings.interval_s * 1000)
    instance = f"{socket.gethostname()}-{os.getpid()}"  # cumulative series of several processes stay apart
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create(
        {"service.name": service_name, "service.instance.id": instance}))
    metrics.set_meter_provider(provider)
    return provider


class JsonLinesMetricExporter(MetricExporter):
    """Appends one JSON object per data point (safe for several processes):
    `{"name", "unit", "attributes", "service", "instance", "time_ns"}` plus `value` (sums, gauges) or
    `count`, `sum`, `bounds`, `counts` (histograms)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        lines = "".join(json.dumps(point) + "\n" for point in data_points(metrics_data))
        with self._lock, open(self.path, "a") as out:
            out.write(lines)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def data_points(metrics_data: MetricsData) -> Iterable[dict]:
    """The SDK's export batch as flat rows, one per data point."""
    for resource_metrics in metrics_data.resource_metrics:
        service = resource_metrics.resource.attributes.get("service.name")
        instance = resource_metrics.resource.attributes.get("service.instance.id")
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    row = {"name": metric.name, "unit": metric.unit, "attributes": dict(point.attributes or {}),
                           "service": service, "instance": instance, "time_ns": point.time_unix_nano}
                    if isinstance(point, HistogramDataPoint):
                        row.update(count=point.count, sum=point.sum, bounds=list(point.explicit_bounds),
                                   counts=list(point.bucket_counts))
                    elif isinstance(point, NumberDataPoint):
                        row["value"] = point.value
                    else:  # exponential histograms: none of rollwire's instruments makes one
                        continue
                    yield row


def read_points(path: Path, name: str) -> list[dict]:
    """The data points of metric `name` in a `file` exporter's output, oldest first."""
    if not Path(path).exists():
        return []
    rows = (json.loads(line) for line in Path(path).read_text().splitlines() if line.strip())
    return [row for row in rows if row["name"] == name]


def lag(ends: dict[int, int], positions: dict[int, int]) -> int:
    """Records between a consumer's positions and the ends of the partitions it reads (a partition
    with no position counts from offset 0: nothing of it consumed)."""
    return sum(max(0, end - positions.get(partition, 0)) for partition, end in ends.items())


class LagProbe:
    """Consumer lag of named groups, read from the log: end offsets minus committed offsets."""

    def __init__(self, log, watched: Sequence[tuple[str, str]]) -> None:
        self.log = log
        self.watched = list(watched)
        """(group id, topic) pairs."""

    def read(self) -> dict[tuple[str, str], int]:
        return {(group, topic): lag(self.log.end_offsets(topic), self.log.committed(group, topic))
                for group, topic in self.watched}

    def observe(self) -> LagProbe:
        """Registers `rollwire.consumer.lag` for the watched groups (read at each export)."""
        observe_lag(lambda: self.read())
        return self


def observe_lag(read: Callable[[], dict[tuple[str, str], int]]) -> None:
    """Registers a `rollwire.consumer.lag` callback; `read` returns lag by (group, topic). A read
    that fails (a topic not created yet, the broker away) reports nothing for that export."""
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        try:
            lags = read()
        except Exception as exc:  # the next export asks again
            logger.info("consumer lag not read this time: %s", exc)
            return []
        return [Observation(value, {GROUP: group, TOPIC: topic}) for (group, topic), value in lags.items()]
    meter().create_observable_gauge("rollwire.consumer.lag", callbacks=[callback], unit="{record}",
                                    description="records not yet consumed, per consumer group and topic")


def observe(name: str, read: Callable[[], dict[str, int]], *, attribute: str, unit: str, description: str) -> None:
    """Registers a gauge whose callback returns one value per `attribute` value."""
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, {attribute: key}) for key, value in read().items()]
    meter().create_observable_gauge(name, callbacks=[callback], unit=unit, description=description)


STALENESS_BOUNDS = (0, 1, 2, 3, 4, 6, 8, 16)
SECONDS_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def staleness_histogram():
    return meter().create_histogram("rollwire.rollout.staleness", unit="{version}",
                                    description="policy versions between sampling and training, per trained rollout",
                                    explicit_bucket_boundaries_advisory=STALENESS_BOUNDS)


def seconds_histogram(name: str, description: str):
    return meter().create_histogram(name, unit="s", description=description,
                                    explicit_bucket_boundaries_advisory=SECONDS_BOUNDS)


def rollouts_counter():
    return meter().create_counter("rollwire.rollouts", unit="{rollout}",
                                  description="rollouts published by env workers, per environment and outcome")
