"""Which event log a process uses: settings for each backend, and the one place that opens it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollwire.core.bus.base import EventLog, TopicConfig
from rollwire.core.errors import ConfigError
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


SECRET_CLIENT_KEYS = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret",
                      "ssl.key.pem", "ssl_key_pem")
"""librdkafka settings that hold a secret: refused in `client_config`, which is written to recipe.json."""


class KafkaSecurity(BaseModel):
    """How clients reach a secured cluster: SCRAM over TLS (`SASL_SSL`), or mutual TLS (`SSL` with
    a client certificate). The password comes from the environment or a file, never from settings
    (a recipe's settings are written to `recipe.json` and passed between processes)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    protocol: Literal["PLAINTEXT", "SSL", "SASL_SSL"] = "PLAINTEXT"
    """`SASL_SSL`: a user and password over TLS; `SSL`: TLS, with `cert_file` and `key_file` the
    client is known by its certificate (mutual TLS); `PLAINTEXT`: neither (loopback development)."""
    ca_file: Path | None = None
    """PEM file of the CA(s) that signed the brokers' certificates; None trusts the system's CAs."""
    cert_file: Path | None = None
    """This client's certificate (PEM), for mutual TLS."""
    key_file: Path | None = None
    """Its private key (PEM, unencrypted; keep the file 0600)."""
    check_hostname: bool = True
    """Check that a broker's certificate names the host connected to."""
    sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = "SCRAM-SHA-512"
    """SASL mechanism for `SASL_SSL`."""
    username: str | None = None
    """SASL user for `SASL_SSL`."""
    password_env: str = "KAFKA_PASSWORD"
    """Environment variable holding the SASL password."""
    password_file: Path | None = None
    """A file holding the SASL password instead (e.g. a mounted secret); read when a client opens."""

    @model_validator(mode="after")
    def _complete(self) -> KafkaSecurity:
        if self.protocol == "SASL_SSL" and not self.username:
            raise ValueError("bus.security.protocol = SASL_SSL needs bus.security.username (and the password in "
                             f"${self.password_env} or bus.security.password_file)")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("mutual TLS needs both bus.security.cert_file and bus.security.key_file")
        if self.protocol == "PLAINTEXT" and (self.cert_file or self.ca_file or self.username):
            raise ValueError("bus.security has certificates or a user but protocol = PLAINTEXT: set protocol "
                             "to SSL (mutual TLS) or SASL_SSL (SCRAM over TLS)")
        return self

    def password(self, environ: Mapping[str, str] = os.environ) -> str:
        if self.password_file is not None:
            try:
                value = self.password_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read the Kafka password from {self.password_file}: {exc.strerror}") from None
        else:
            value = environ.get(self.password_env, "").strip()
        if not value:
            raise ConfigError(f"no Kafka password for user {self.username!r}: set ${self.password_env}"
                              + (f" or fill {self.password_file}" if self.password_file else ""))
        return value

    def librdkafka(self, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
        """These settings as confluent-kafka (librdkafka) client settings."""
        config: dict[str, Any] = {"security.protocol": self.protocol}
        if self.protocol == "PLAINTEXT":
            return config
        if self.ca_file is not None:
            config["ssl.ca.location"] = str(self.ca_file)
        if self.cert_file is not None and self.key_file is not None:
            config["ssl.certificate.location"] = str(self.cert_file)
            config["ssl.key.location"] = str(self.key_file)
        config["ssl.endpoint.identification.algorithm"] = "https" if self.check_hostname else "none"
        if self.protocol == "SASL_SSL":
            config.update({"sasl.mechanisms": self.sasl_mechanism, "sasl.username": self.username,
                           "sasl.password": self.password(environ)})
        return config

    def faust_credentials(self, environ: Mapping[str, str] = os.environ) -> Any:
        """These settings as faust (aiokafka) broker credentials; None for PLAINTEXT."""
        if self.protocol == "PLAINTEXT":
            return None
        import ssl

        import faust
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        context.check_hostname = self.check_hostname
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        if self.protocol == "SSL":
            return faust.SSLCredentials(context)
        return faust.SASLCredentials(username=self.username, password=self.password(environ), ssl_context=context,
                                     mechanism=self.sasl_mechanism)


class KafkaBusSettings(BaseModel):
    """A Kafka cluster."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["kafka"] = "kafka"
    """`kafka`: a cluster; `embedded`: a local directory."""
    bootstrap_servers: str = "127.0.0.1:9092"
    """Comma-separated `host:port` list; the `KAFKA_BOOTSTRAP_SERVERS` variable is a common source."""
    security: KafkaSecurity = KafkaSecurity()
    """TLS and authentication (`[bus.security]`): SCRAM over TLS or mutual TLS."""
    client_config: dict[str, Any] = Field(default_factory=dict)
    """Extra librdkafka settings for every client (e.g. `linger.ms`); never a secret (those come
    from `security`, read from the environment or files)."""
    replication_factor: int = -1
    """Replicas of each created topic; -1 takes the broker's `default.replication.factor`."""
    outage_s: float = Field(default=300.0, gt=0)
    """How long a component waits for a cluster it cannot reach (a broker restart) before it fails:
    unsent records are kept and retried that long, reads, commits and metadata asked again."""

    @field_validator("client_config")
    @classmethod
    def _no_secrets(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = sorted(k for k in value if k in SECRET_CLIENT_KEYS)
        if found:
            raise ValueError(f"bus.client_config holds {', '.join(found)}: secrets never go in settings (they "
                             "would be written to recipe.json); use bus.security (the password from "
                             "$KAFKA_PASSWORD or password_file, the key from key_file)")
        return value

    def client_settings(self, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
        """Every librdkafka setting of this cluster's clients but the bootstrap servers."""
        return {**self.security.librdkafka(environ), **self.client_config}

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
        from rollwire.core.bus.kafka import KafkaLog
        return KafkaLog(settings.bootstrap_servers, client_config=settings.client_settings(),
                        replication_factor=settings.replication_factor, outage_s=settings.outage_s)
    from rollwire.core.bus.embedded import EmbeddedLog
    return EmbeddedLog(settings.path, fsync=settings.fsync)


def catalog_topics(topics: Topics, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> list[TopicConfig]:
    """TopicConfigs for every catalog topic under `topics.prefix`."""
    return [TopicConfig(name=name, partitions=spec.partitions, compacted=spec.cleanup == "compact",
                        retention_ms=spec.retention_ms,
                        max_message_bytes=max(2 * 1024 * 1024, 2 * max_event_bytes))
            for name, spec in topics.specs()]
