"""OpenTelemetry metrics: the file exporter's rows, the instruments the components record."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from rollwire.core import metrics
from rollwire.core.metrics import JsonLinesMetricExporter, MetricsSettings, data_points, lag, read_points


def test_lag_counts_partitions_without_a_position_from_the_start():
    assert lag({0: 10, 1: 5}, {0: 7}) == 3 + 5
    assert lag({0: 10}, {0: 12}) == 0, "a position past the end (a topic recreated) is no negative lag"


def test_the_file_exporter_writes_one_row_per_data_point(tmp_path):
    exporter = JsonLinesMetricExporter(tmp_path / "m.jsonl")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("test")
    staleness = meter.create_histogram("rollwire.rollout.staleness", explicit_bucket_boundaries_advisory=(0, 1, 2))
    for value in (0, 1, 1, 2, 5):
        staleness.record(value)
    meter.create_counter("rollwire.rollouts").add(3, {"outcome": "completed"})

    exporter.export(reader.get_metrics_data())

    (histogram,) = read_points(tmp_path / "m.jsonl", "rollwire.rollout.staleness")
    assert histogram["count"] == 5 and histogram["sum"] == 9
    assert histogram["bounds"] == [0, 1, 2] and histogram["counts"] == [1, 2, 1, 1]
    (counter,) = read_points(tmp_path / "m.jsonl", "rollwire.rollouts")
    assert counter["value"] == 3 and counter["attributes"] == {"outcome": "completed"}
    provider.shutdown()


def test_a_lag_read_that_fails_reports_nothing_and_the_next_one_reports_again(monkeypatch):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(metrics, "meter", lambda: provider.get_meter("test"))
    answers = iter([RuntimeError("topic not there yet"), {("g", "t"): 4}])

    def read():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def lag_points():
        data = reader.get_metrics_data()
        return [(p["attributes"], p["value"]) for p in data_points(data) if p["name"] == "rollwire.consumer.lag"] \
            if data else []

    metrics.observe_lag(read)
    assert lag_points() == []
    assert lag_points() == [({metrics.GROUP: "g", metrics.TOPIC: "t"}, 4)]
    provider.shutdown()


def test_file_exporter_settings_need_a_path():
    from rollwire.core.errors import ConfigError
    with pytest.raises(ConfigError, match="file_path"):
        metrics.configure(MetricsSettings(exporter="file"), "test")


def test_otlp_export_reaches_an_otlp_http_receiver_as_protobuf(monkeypatch):
    """The `otlp` exporter's wiring: an OTLP/HTTP receiver (here a minimal one decoding the protobuf
    request, as a collector does) gets every instrument, with the service and its instance."""
    import http.server
    import threading

    from opentelemetry import metrics as otel_metrics
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    received: list = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            request = ExportMetricsServiceRequest()
            request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, request))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(otel_metrics, "set_meter_provider", lambda provider: None)  # not this process's global
    provider = metrics.configure(MetricsSettings(exporter="otlp", interval_s=60,
                                                 otlp_endpoint=f"http://127.0.0.1:{server.server_port}/v1/metrics"),
                                 "rollwire-test")
    monkeypatch.setattr(metrics, "meter", lambda: provider.get_meter("rollwire"))
    metrics.staleness_histogram().record(1)
    metrics.observe_lag(lambda: {("env-workers", "p.tasks"): 7})
    assert provider.force_flush()
    provider.shutdown()
    server.shutdown()

    (path, request), *_ = received
    assert path == "/v1/metrics"
    resource = {a.key: a.value.string_value for a in request.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "rollwire-test" and resource["service.instance.id"]
    found = {m.name: m for scope in request.resource_metrics[0].scope_metrics for m in scope.metrics}
    assert found["rollwire.rollout.staleness"].histogram.data_points[0].count == 1
    (lag,) = found["rollwire.consumer.lag"].gauge.data_points
    assert lag.as_int == 7 and {a.key: a.value.string_value for a in lag.attributes} == {
        metrics.GROUP: "env-workers", metrics.TOPIC: "p.tasks"}
