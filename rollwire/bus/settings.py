"""Which event log a process uses: settings for each backend, and the one place that opens it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwire.bus.base import EventLog, TopicConfig
from rollwire.schemas.envelope import DEFAULT_MAX_EVENT_BYTES
from rollwire.schemas.topics import Topics


class EmbeddedBusSettings(BaseModel):
    """The embedded log: a local directory, shared by every process of one machine."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["embedded"] = "embedded"
    """`embedded`: a directory shared by the processes of one machine; `kafka`: a cluster."""
    path: Path = Path("runs/default/log")
    """Directory of the log; created if missing."""
    fsync: bool = False
    """Also survive power loss (each flush waits for the disk); a process crash never loses a
    flushed record either way."""


class KafkaBusSettings(BaseModel):
    """A Kafka cluster."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["kafka"] = "kafka"
    """`kafka`: a cluster; `embedded`: a local directory."""
    bootstrap_servers: str = "127.0.0.1:9092"
    """Comma-separated `host:port` list; the `KAFKA_BOOTSTRAP_SERVERS` variable is a common source."""
    client_config: dict[str, Any] = Field(default_factory=dict)
    """Extra librdkafka settings for every client (e.g. `security.protocol`, `sasl.mechanism`)."""
    replication_factor: int = -1
    """Replicas of each created topic; -1 takes the broker's `default.replication.factor`."""
    outage_s: float = Field(default=300.0, gt=0)
    """How long a component waits for a cluster it cannot reach (a broker restart) before it fails:
    unsent records are kept and retried that long, reads, commits and metadata asked again."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _has_port(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"bootstrap_servers entry {server!r} needs the form host:port "
                                 "(set bus.bootstrap_servers or --bootstrap)")
        return value


BusSettings = Annotated[EmbeddedBusSettings | KafkaBusSettings, Field(discriminator="type")]


def open_log(settings: EmbeddedBusSettings | KafkaBusSettings) -> EventLog:
    """Opens the event log the settings describe; the Kafka client is imported only when used."""
    if settings.type == "kafka":
        from rollwire.bus.kafka import KafkaLog
        return KafkaLog(settings.bootstrap_servers, client_config=settings.client_config,
                        replication_factor=settings.replication_factor, outage_s=settings.outage_s)
    from rollwire.bus.embedded import EmbeddedLog
    return EmbeddedLog(settings.path, fsync=settings.fsync)


def catalog_topics(topics: Topics, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> list[TopicConfig]:
    """TopicConfigs for every catalog topic under `topics.prefix`."""
    return [TopicConfig(name=name, partitions=spec.partitions, compacted=spec.cleanup == "compact",
                        retention_ms=spec.retention_ms,
                        max_message_bytes=max(2 * 1024 * 1024, 2 * max_event_bytes))
            for name, spec in topics.specs()]
