"""The event log on Apache Kafka, through confluent-kafka (librdkafka).

Producers are idempotent (acks=all, ordered retries without duplicates) and partition keys with
murmur2 like the Java client and the embedded log. Consumers never auto-commit and read with
`isolation.level=read_committed`. librdkafka's own log lines go to the `rollwire.core.bus.kafka`
logger. Library exceptions are turned into `rollwire.core.bus.errors` types at this boundary.

A cluster that goes away for a while (a broker restart, a network cut) is waited for, up to
`outage_s`: producers keep what they could not send (librdkafka retries it, in order and without
duplicates, for `message.timeout.ms` = `outage_s`), and metadata requests, commits and topic
creation are asked again. Past `outage_s` the error is raised, so a cluster that is really gone
still ends the process with a message.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from rollwire.core.bus.base import (
    AtOffsets,
    AtTime,
    Beginning,
    Consumer,
    EventLog,
    Headers,
    OffsetReset,
    Producer,
    Record,
    StartAt,
    TopicConfig,
)
from rollwire.core.bus.errors import BusError, CommitFailedError, DeliveryError, TopicError

logger = logging.getLogger(__name__)

_FENCED = {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
           KafkaError.FENCED_INSTANCE_ID}
_SEND_RETRIES = 50
DEFAULT_OUTAGE_S = 300.0

_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._WAIT_COORD,
                KafkaError._RESOLVE, KafkaError.NETWORK_EXCEPTION, KafkaError.REQUEST_TIMED_OUT,
                KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_CONTROLLER}
"""Answers that mean the cluster (or the part of it a request needs) cannot be reached right now."""


def unreachable(err: KafkaError) -> bool:
    """Whether `err` says the cluster is away for now (worth waiting for), not that the request is wrong."""
    return err.code() in _UNREACHABLE or (err.retriable() and not err.fatal())


_REFUSED = {KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.GROUP_AUTHORIZATION_FAILED}
"""Answers that mean the cluster will not let this client in (credentials, certificates, ACLs)."""


class Refusal:
    """What the cluster said when it refused this client (librdkafka's `error_cb` of every client
    of one log): waiting for the cluster is pointless then, and the message says why."""

    FRESH_S = 30.0
    """A refusal counts this long: librdkafka keeps trying, so a lasting one is noted again and
    again, and one a restarting broker gave in passing is forgotten."""

    SIGNS = ("Authentication failed", "SSL handshake failed", "bad certificate", "certificate verify failed",
             "certificate required", "unknown ca")
    """What librdkafka's messages say when TLS or SASL refused the client (a refused certificate
    comes as a transport error)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._at = 0.0
        self._served: list[Any] = []

    def serve(self, client: Any) -> Any:
        """Has `check` serve `client`'s error callbacks (librdkafka delivers them only in `poll`);
        an admin client or a producer, whose `poll` consumes nothing."""
        self._served.append(client)
        return client

    def note(self, err: KafkaError) -> None:
        if err.code() in _REFUSED or any(sign in err.str() for sign in self.SIGNS):
            self.reason, self._at = err.str(), time.monotonic()
        else:
            logger.debug("kafka client error: %s", err.str())

    def check(self, what: str) -> None:
        for client in self._served:
            client.poll(0)
        if self.reason is not None and time.monotonic() - self._at < self.FRESH_S:
            raise BusError(f"{what}: the Kafka cluster refused this client: {self.reason} (check bus.security: "
                           "protocol, user and password, certificates)")


def patiently(what: str, call: Any, wait_s: float, refused: Refusal | None = None) -> Any:
    """`call()`, asked again while the cluster is unreachable, for up to `wait_s` seconds. Logs once
    when it starts waiting and once when the cluster answers again; other errors pass through, and
    so does a refusal (`refused`: bad credentials are not an outage)."""
    deadline, delay, waited_since = time.monotonic() + wait_s, 0.25, None
    while True:
        try:
            result = call()
        except KafkaException as exc:
            err = exc.args[0]
            if refused is not None:
                refused.check(what)
            if not isinstance(err, KafkaError) or not unreachable(err) or time.monotonic() + delay > deadline:
                raise
            if waited_since is None:
                waited_since = time.monotonic()
                logger.warning("%s: the Kafka cluster cannot be reached (%s); waiting up to %.0f s for it",
                               what, err.str(), wait_s)
            time.sleep(delay)
            delay = min(2 * delay, 5.0)
            continue
        if waited_since is not None:
            logger.warning("%s: the Kafka cluster answers again after %.0f s", what, time.monotonic() - waited_since)
        return result


def _topic_exists(client: Any, topic: str, wait_s: float = DEFAULT_OUTAGE_S, refused: Refusal | None = None) -> int:
    """Partition count of `topic`, from cluster metadata; raises `TopicError` when absent (or when
    the cluster stayed unreachable for `wait_s`)."""
    try:
        meta = patiently(f"metadata of {topic}", lambda: client.list_topics(topic=topic, timeout=10.0), wait_s,
                         refused)
    except KafkaException as exc:
        raise TopicError(f"could not read metadata for {topic!r}: {exc}") from exc
    info = meta.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise TopicError(f"topic {topic!r} does not exist on the broker: create it first "
                         "(EventLog.create_topics, or `rollwire topics --create --bus kafka`)")
    return len(info.partitions)


class KafkaProducer(Producer):
    def __init__(self, config: dict[str, Any], outage_s: float = DEFAULT_OUTAGE_S, refused: Refusal | None = None) -> None:
        self._refused = refused or Refusal()
        self._producer = confluent_kafka.Producer({
            "error_cb": self._refused.note,
            "enable.idempotence": True,  # implies acks=all and ordered retries without duplicates
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.timeout.ms": int(outage_s * 1000),  # how long an unsent record is kept and retried
            "message.max.bytes": 64 * 1024 * 1024,  # topics' max.message.bytes is the real limit
            "logger": logger,
            **config,
        })
        self._outage_s = outage_s
        self._delivery_s = float(config.get("message.timeout.ms", outage_s * 1000)) / 1000
        self._known: set[str] = set()
        self._failures: list[tuple[str, bytes | None, str]] = []

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._failures.append((msg.topic(), msg.key(), f"{err.name()}: {err.str()}"))

    def send(self, topic: str, value: bytes | None, *, key: bytes | None = None, headers: Headers = (),
             timestamp_ms: int | None = None, partition: int | None = None) -> None:
        if topic not in self._known:
            _topic_exists(self._producer, topic, self._outage_s, self._refused)
            self._known.add(topic)
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": self._on_delivery}
        if headers:
            kwargs["headers"] = list(headers)
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        if partition is not None:
            kwargs["partition"] = partition
        for _ in range(_SEND_RETRIES):
            try:
                self._producer.produce(topic, **kwargs)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                self._producer.poll(0.1)
            except KafkaException as exc:  # rejected before queuing, e.g. over message.max.bytes
                self._failures.append((topic, key, str(exc.args[0])))
                break
        else:
            self._failures.append((topic, key, "the producer queue stayed full: flush more often"))
        self._producer.poll(0)

    def flush(self, timeout_s: float | None = None) -> None:
        # None: until each record is delivered or has failed (after message.timeout.ms of retries)
        timeout = self._delivery_s + 5.0 if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while (remaining := self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))) and \
                time.monotonic() < deadline:
            self._refused.check("sending")
        failures, self._failures = self._failures, []
        if remaining:
            failures.append(("*", None, f"{remaining} record(s) still queued after {timeout:.0f} s"))
        if failures:
            shown = "; ".join(f"{t} key={k!r}: {why}" for t, k, why in failures[:5])
            raise DeliveryError(f"{len(failures)} record(s) were not delivered: {shown}", failures)

    def close(self) -> None:
        self.flush()


class KafkaConsumer(Consumer):
    """A group member (`group_id` set) or a reader (`start` set)."""

    def __init__(self, config: dict[str, Any], topics: Sequence[str], *, group_id: str | None = None,
                 reset: OffsetReset = "earliest", session_timeout_s: float = 10.0,
                 start: StartAt | None = None, outage_s: float = DEFAULT_OUTAGE_S,
                 refused: Refusal | None = None) -> None:
        if not topics:
            raise BusError("a consumer needs at least one topic")
        session_ms = int(session_timeout_s * 1000)
        self._grouped = group_id is not None
        self._refused = refused or Refusal()
        self._consumer = confluent_kafka.Consumer({
            "error_cb": self._refused.note,
            "group.id": group_id or f"rollwire-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": reset,
            "isolation.level": "read_committed",
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(100, session_ms // 5),
            "logger": logger,
            **config,
        })
        self._consumed: dict[tuple[str, int], int] = {}
        self._outage_s = outage_s
        partitions = {t: _topic_exists(self._consumer, t, outage_s, self._refused) for t in topics}
        if self._grouped:
            self._consumer.subscribe(list(topics), on_revoke=self._on_revoke)
        else:
            self._consumer.assign(self._start_positions(partitions, start or Beginning()))

    def _start_positions(self, partitions: dict[str, int], start: StartAt) -> list[TopicPartition]:
        tps = [TopicPartition(t, p) for t, n in partitions.items() for p in range(n)]
        if isinstance(start, Beginning):
            return [TopicPartition(tp.topic, tp.partition, confluent_kafka.OFFSET_BEGINNING) for tp in tps]
        if isinstance(start, AtOffsets):
            return [TopicPartition(tp.topic, tp.partition,
                                   start.offsets.get((tp.topic, tp.partition), confluent_kafka.OFFSET_END))
                    for tp in tps]
        if isinstance(start, AtTime):
            query = [TopicPartition(tp.topic, tp.partition, start.timestamp_ms) for tp in tps]
            found = patiently("offsets by time", lambda: self._consumer.offsets_for_times(query, timeout=10.0),
                              self._outage_s, self._refused)
            return [TopicPartition(tp.topic, tp.partition,
                                   tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_END)
                    for tp in found]
        raise TypeError(f"unknown start position {start!r}")

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._consumed.pop((tp.topic, tp.partition), None)

    def _record(self, msg: Any) -> Record | None:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return None
            if err.fatal():
                raise BusError(f"fatal consumer error: {err.str()}")
            if err.code() in _REFUSED:
                raise BusError(f"the Kafka cluster refused this consumer: {err.str()} (check bus.security)")
            if not unreachable(err):  # the cluster away: librdkafka reconnects, and says so in its log
                logger.warning("consumer error on %s: %s", msg.topic(), err.str())
            return None
        _, ts = msg.timestamp()
        record = Record(topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), key=msg.key(),
                        value=msg.value(), timestamp_ms=ts, headers=tuple(msg.headers() or ()))
        self._consumed[(record.topic, record.partition)] = record.offset + 1
        return record

    def poll_batch(self, max_records: int, timeout_s: float = 1.0) -> list[Record]:
        self._refused.check("reading")
        deadline = time.monotonic() + timeout_s
        first = None
        while first is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            msg = self._consumer.poll(remaining)
            if msg is None:
                return []
            first = self._record(msg)
        batch = [first]
        if max_records > 1:  # whatever else is already fetched, without waiting
            for msg in self._consumer.consume(max_records - 1, timeout=0):
                record = self._record(msg)
                if record is not None:
                    batch.append(record)
        return batch

    def consumed_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self._consumed)

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        if not self._grouped:
            raise BusError("a reader has no group to commit to: use EventLog.consumer(group_id=...)")
        if not offsets:
            return
        positions = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            patiently("commit", lambda: self._consumer.commit(offsets=positions, asynchronous=False), self._outage_s,
                      self._refused)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() in _FENCED:
                raise CommitFailedError(f"commit refused after a rebalance ({err.name()}); the "
                                        "uncommitted records will be delivered to the new owner") from exc
            raise BusError(f"commit failed: {err.str()}") from exc

    def assignment(self) -> list[tuple[str, int]]:
        return sorted((tp.topic, tp.partition) for tp in self._consumer.assignment())

    def close(self) -> None:
        self._consumer.close()


class KafkaLog(EventLog):
    """The event log on a Kafka cluster at `bootstrap_servers`.

    `client_config` adds librdkafka settings (security, SASL, …) to every client;
    `replication_factor=-1` takes the broker's `default.replication.factor`.
    """

    def __init__(self, bootstrap_servers: str, *, client_config: dict[str, Any] | None = None,
                 replication_factor: int = -1, outage_s: float = DEFAULT_OUTAGE_S) -> None:
        self._config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, **(client_config or {})}
        self._replication_factor = replication_factor
        self._outage_s = outage_s
        self._refused = Refusal()
        self._admin = self._refused.serve(AdminClient({**self._config, "logger": logger, "error_cb": self._refused.note}))  # type: ignore[dict-item]  # librdkafka takes a Logger
        self._meta: confluent_kafka.Consumer | None = None

    def _metadata_consumer(self) -> confluent_kafka.Consumer:
        if self._meta is None:
            self._meta = confluent_kafka.Consumer({**self._config, "group.id": "rollwire-metadata",
                                                   "enable.auto.commit": False, "logger": logger,
                                                   "error_cb": self._refused.note})
        return self._meta

    def create_topics(self, topics: Iterable[TopicConfig]) -> None:
        new = []
        for t in topics:
            config = {"cleanup.policy": "compact" if t.compacted else "delete",
                      "max.message.bytes": str(t.max_message_bytes)}
            if not t.compacted:
                config["retention.ms"] = str(t.retention_ms if t.retention_ms is not None else -1)
            new.append(NewTopic(t.name, num_partitions=t.partitions,
                                replication_factor=self._replication_factor, config=config))
        if not new:
            return
        try:  # reached first: a refused client learns why within seconds, not after a creation timeout
            patiently("reaching the cluster", lambda: self._admin.list_topics(timeout=10), self._outage_s, self._refused)
        except KafkaException as exc:
            raise TopicError(f"could not reach the Kafka cluster to create topics: {exc.args[0].str()}") from exc
        for created in new:
            try:
                patiently(f"creating {created.topic}", lambda t=created: self._create(t), self._outage_s,
                          self._refused)
            except KafkaException as exc:
                raise TopicError(f"could not create topic {created.topic!r}: {exc.args[0].str()}") from exc
        for created in new:  # creation is asynchronous on the brokers: wait until metadata shows it
            self._wait_for_topic(created.topic)

    def _create(self, topic: NewTopic) -> None:
        for future in self._admin.create_topics([topic], operation_timeout=30).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

    def _wait_for_topic(self, topic: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            meta = patiently(f"metadata of {topic}", lambda: self._admin.list_topics(topic=topic, timeout=10),
                             self._outage_s, self._refused)
            info = meta.topics.get(topic)
            if info is not None and info.error is None and info.partitions and \
                    all(p.leader >= 0 for p in info.partitions.values()):
                return
            if time.monotonic() > deadline:
                raise TopicError(f"topic {topic!r} was created but has no leader after {timeout_s} s")
            time.sleep(0.1)

    def partitions(self, topic: str) -> int:
        return _topic_exists(self._admin, topic, self._outage_s, self._refused)

    def producer(self) -> KafkaProducer:
        return KafkaProducer(self._config, self._outage_s, self._refused)

    def consumer(self, topics: Sequence[str], group_id: str, *, reset: OffsetReset = "earliest",
                 session_timeout_s: float = 10.0) -> KafkaConsumer:
        if not group_id:
            raise BusError("a group consumer needs a non-empty group_id")
        return KafkaConsumer(self._config, topics, group_id=group_id, reset=reset,
                             session_timeout_s=session_timeout_s, outage_s=self._outage_s, refused=self._refused)

    def reader(self, topics: Sequence[str], start: StartAt = Beginning()) -> KafkaConsumer:
        return KafkaConsumer(self._config, topics, start=start, outage_s=self._outage_s, refused=self._refused)

    def end_offsets(self, topic: str) -> dict[int, int]:
        consumer = self._metadata_consumer()
        n = _topic_exists(consumer, topic, self._outage_s, self._refused)
        try:
            return {p: patiently(f"end offset of {topic}",
                                 lambda p=p: _high_watermark(consumer, TopicPartition(topic, p)),
                                 self._outage_s, self._refused)
                    for p in range(n)}
        except KafkaException as exc:  # what the log's callers handle is a BusError
            raise BusError(f"could not read the end offsets of {topic!r}: {exc.args[0].str()}") from exc

    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        n = _topic_exists(self._admin, topic, self._outage_s, self._refused)
        probe = confluent_kafka.Consumer({**self._config, "group.id": group_id, "enable.auto.commit": False,
                                          "logger": logger})
        try:
            found = patiently(f"{group_id}'s offsets", lambda: probe.committed(
                [TopicPartition(topic, p) for p in range(n)], timeout=10), self._outage_s, self._refused)
        finally:
            probe.close()
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}

    def close(self) -> None:
        if self._meta is not None:
            self._meta.close()
            self._meta = None


_SETTLING = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
             KafkaError._UNKNOWN_PARTITION)
"""Answers a broker gives for a partition it is still taking over (a topic just created, a leader
just moved), and the client's own for a partition its metadata lost a moment (the broker started
again: the chaos run saw it): worth asking again shortly."""


def _high_watermark(consumer: Any, partition: TopicPartition, settle_s: float = 15.0) -> int:
    """The partition's end offset, asked again while its leader settles (a topic created a moment
    ago answered NOT_LEADER_FOR_PARTITION though the metadata already named a leader)."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=10)[1]
        except KafkaException as exc:
            if exc.args[0].code() not in _SETTLING or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
