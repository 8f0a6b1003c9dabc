"""Shared test fixtures: one real Kafka broker per session, and a fresh set of topics per test.

The broker is started here (from `deploy/kafka/broker.py`) only when a test asks for it, and is
stopped by its PID when the session ends. With `KAFKA_BOOTSTRAP_SERVERS` set, that broker is used
instead. A broker that cannot start fails the Kafka tests with the reason; they are never skipped.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rollwire.core.bus import EmbeddedBusSettings, EventLog, KafkaBusSettings, TopicConfig, open_log
from rollwire.core.processes import yield_idle_cpu
from rollwire.schemas import Topics

REPO = Path(__file__).resolve().parent.parent
yield_idle_cpu()  # two test workers share the cores, with the runs and servers they start
sys.path.insert(0, str(Path(__file__).resolve().parent))
import docker_engine  # noqa: E402  (tests/, on the path just above)
import lanes  # noqa: E402


def _deploy_module(name: str, path: str):
    """A stdlib-only script under deploy/ (they are not a package), imported by path."""
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _session_service(folder: Path, *, external: str, script: str, error: str, what: str,
                     address: str) -> Iterator[str]:
    """A real service for the whole session, from a stdlib-only script under deploy/ (its `start(folder)`
    and `stop(info)`): the address `external` names in the environment if set, else one started here
    and stopped by its PID at the end. A service that cannot start fails its tests with the reason,
    never skips them."""
    if os.environ.get(external):
        yield os.environ[external]
        return
    module = _deploy_module(f"rollwire_{Path(script).stem}", script)
    try:
        info = module.start(folder)
    except getattr(module, error) as exc:
        pytest.fail(f"could not start {what}: {exc}", pytrace=False)
    try:
        yield getattr(info, address)
    finally:
        module.stop(info)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker for the whole session (`KAFKA_BOOTSTRAP_SERVERS`: that one)."""
    yield from _session_service(tmp_path_factory.mktemp("kafka-broker"), external="KAFKA_BOOTSTRAP_SERVERS",
                                script="deploy/kafka/broker.py", error="BrokerError",
                                what="the Kafka broker for the kafka tests", address="bootstrap")


@pytest.fixture(scope="session")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server for the session (`deploy/mlflow/server.py`: installed once into
    `.cache/mlflow`, about 20 s the first time). With `MLFLOW_TEST_URL` set, that server is used."""
    yield from _session_service(tmp_path_factory.mktemp("mlflow-server"), external="MLFLOW_TEST_URL",
                                script="deploy/mlflow/server.py", error="ServerError",
                                what="the MLflow server for the mlflow tests", address="url")


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def bus_settings(request: pytest.FixtureRequest, tmp_path: Path) -> EmbeddedBusSettings | KafkaBusSettings:
    """Settings of one backend; contract tests run once per backend."""
    if request.param == "kafka":
        return KafkaBusSettings(bootstrap_servers=request.getfixturevalue("kafka_bootstrap"))
    return EmbeddedBusSettings(path=tmp_path / "log")


@pytest.fixture
def log(bus_settings) -> Iterator[EventLog]:
    event_log = open_log(bus_settings)
    yield event_log
    event_log.close()


@pytest.fixture
def topics() -> Topics:
    """Catalog topic names under a prefix no other test uses."""
    return Topics(f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture
def new_topic(log: EventLog):
    """Creates a topic with a name no other test uses, and returns the name."""
    def make(partitions: int = 1, *, compacted: bool = False, max_message_bytes: int = 2 * 1024 * 1024) -> str:
        name = f"t{uuid.uuid4().hex[:12]}"
        log.create_topics([TopicConfig(name, partitions=partitions, compacted=compacted,
                                       max_message_bytes=max_message_bytes)])
        return name
    return make


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 HTTP endpoint (moto's standalone server) on a free loopback port."""
    import logging

    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"{host}:{port}"
    server.stop()


@pytest.fixture
def s3_store(s3_endpoint):
    """A fresh bucket on the S3 endpoint."""
    from rollwire.core.objectstore import S3Store
    return S3Store(s3_endpoint, f"b{uuid.uuid4().hex[:12]}", access_key="test", secret_key="test", secure=False,
                   region="us-east-1")


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """Each object-store backend."""
    if request.param == "s3":
        return request.getfixturevalue("s3_store")
    from rollwire.core.objectstore import LocalStore
    return LocalStore(tmp_path / "store")


@pytest.fixture
def group_id() -> str:
    return f"g{uuid.uuid4().hex[:12]}"


_SPANS = InMemorySpanExporter()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """The spans this process records during the test (one SDK provider for the whole session)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_SPANS))
        trace.set_tracer_provider(provider)
    _SPANS.clear()
    return _SPANS


def _no_prebuild(config: pytest.Config) -> bool:
    return bool(config.option.collectonly or os.environ.get("ROLLWIRE_NO_PREBUILD"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Orders the tests (`lanes.LANES`); starts building the images the session's docker tests need, in the background, now
    (`docker_engine.Prebuild`); ROLLWIRE_NO_PREBUILD=1 leaves it to the first test that needs them."""
    unplaced = [item.nodeid for item in items if (item.get_closest_marker("stack") or item.get_closest_marker(
        "container")) and not docker_engine.images_for([item.nodeid])]
    if unplaced:
        raise pytest.UsageError(f"{unplaced[0]} runs containers but tests/docker_engine.py IMAGES_BY_PATH names no "
                                "images for its path: add it")
    lanes.order(items)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller builds the images
        return
    if not _no_prebuild(config):
        docker_engine.start_prebuild(docker_engine.images_for(item.nodeid for item in items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s workers: the whole runs on one, the rest on the other (`lanes.TwoLanes`)."""
    return lanes.make_scheduler(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """In pytest-xdist's controller, which outlives its workers: the engine and the image prebuild
    for the session (a worker's docker test waits for them through `images.py`'s build lock)."""
    if not _no_prebuild(node.config):
        docker_engine.start_prebuild(docker_engine.images_for(ids))


def pytest_sessionfinish(session, exitstatus):
    if docker_engine.PREBUILD is not None:
        docker_engine.PREBUILD.stop()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Says how many tests of each service marker ran, so a log shows Kafka was really used."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            if report.when != "call" and outcome != "error" and outcome != "skipped":
                continue
            for marker in ("kafka", "vllm", "mlflow", "container", "stack"):
                if marker in getattr(report, "keywords", {}):
                    counts.setdefault(marker, {}).setdefault(outcome, 0)
                    counts[marker][outcome] += 1
    for marker, by_outcome in counts.items():
        parts = ", ".join(f"{n} {o}" for o, n in sorted(by_outcome.items()))
        terminalreporter.write_line(f"{marker} tests against a real service: {parts}")
    _tier_times(terminalreporter)


def _tier_times(terminalreporter) -> None:
    """Seconds spent in each tier (tests/<tier>/: setup, call and teardown of its tests; a session
    service is counted where the first test that needs it starts it), so CI's output says where
    its time went."""
    seconds: dict[str, float] = {}
    tests: dict[str, set[str]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            if not nodeid.startswith("tests/") or not hasattr(report, "duration"):
                continue
            tier = nodeid.split("/")[1] if nodeid.count("/") > 1 else "tests"
            seconds[tier] = seconds.get(tier, 0.0) + report.duration
            tests.setdefault(tier, set()).add(nodeid)
    if seconds:
        rows = ", ".join(f"{tier} {s / 60:.1f} min ({len(tests[tier])})" for tier, s in
                         sorted(seconds.items(), key=lambda item: -item[1]))
        workers = terminalreporter.config.getoption("numprocesses", None)
        summed = f" (summed over {workers} workers: more than the session's wall time)" if workers else ""
        terminalreporter.write_line(f"time by tier (minutes, tests){summed}: {rows}; "
                                    f"in all {sum(seconds.values()) / 60:.1f} min")


@pytest.fixture
def bus_settings_kafka(kafka_bootstrap: str) -> KafkaBusSettings:
    return KafkaBusSettings(bootstrap_servers=kafka_bootstrap)
