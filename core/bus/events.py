"""Events over the log: encode, trace and send; poll, decode, and dead-letter what cannot be used.

    EventProducer.send(topic, event, key)  ── span `send <topic>`, traceparent header, envelope
    EventConsumer.poll()                   ── Delivery(event, envelope, record), or, for a record
                                              that is not a valid event, a DeadLetter on the
                                              dead-letter topic and on to the next record
    EventConsumer.dead_letter(delivery, error)
                                           ── for a valid event the component cannot use
    read_to_end(log, topics, dead_letters) ── every event on `topics` up to their end offsets
                                              when called (not "until a poll comes back empty")
    Follower(log, topics, on_event)        ── a view kept current: every event from the beginning,
                                              then each new one, handed over in a background thread

A consumer never stops for one bad record. `EventConsumer.commit` flushes the dead letters
before committing, so a record is never committed past without being either handled or kept.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Generic, TypeVar

from rollwire.core import telemetry
from rollwire.core.bus.base import AtOffsets, Consumer, EventLog, Producer, Record
from rollwire.core.errors import ConfigError
from rollwire.schemas.base import Event, new_id
from rollwire.schemas.deadletter import RAW_BYTES_KEPT, DeadLetter, DeadLetterStage
from rollwire.schemas.envelope import Codec, Envelope
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.topics import Topics

logger = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class Delivery(Generic[E]):
    """One decoded event with the record it came in."""

    envelope: Envelope[E]
    record: Record

    @property
    def event(self) -> E:
        return self.envelope.event


@dataclass(frozen=True)
class Outgoing:
    """An event ready for any producer: key, envelope bytes, headers carrying the trace context."""

    event_id: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def encoded(topics: Topics, codec: Codec, producer_name: str, topic: str, event: Event,
            key: str | bytes | None) -> Outgoing:
    """Checks `event` belongs on `topic` and encodes it, with the current trace context if any."""
    topics.check(topic, event)
    traceparent = telemetry.current_traceparent()
    event_id = new_id()
    value = codec.encode(event, producer=producer_name, event_id=event_id, traceparent=traceparent)
    return Outgoing(event_id, key.encode() if isinstance(key, str) else key, value,
                    [("traceparent", traceparent.encode())] if traceparent else [])


@contextmanager
def outgoing(topics: Topics, codec: Codec, producer_name: str, topic: str, event: Event,
             key: str | bytes | None) -> Iterator[Outgoing]:
    """`encoded` inside a `send <topic>` span; hand the result to a producer within the `with`
    block so the span covers the send."""
    with telemetry.send_span(topic, key.encode() if isinstance(key, str) else key, event.type):
        yield encoded(topics, codec, producer_name, topic, event, key)


class EventProducer:
    """Sends events to catalog topics, each in a traced, versioned envelope."""

    def __init__(self, producer: Producer, topics: Topics, *, name: str, codec: Codec | None = None):
        self._producer, self.topics, self.name = producer, topics, name
        self.codec = codec or Codec()

    def send(self, topic: str, event: Event, *, key: str | bytes | None, partition: int | None = None) -> str:
        """Queues `event` on `topic` (a full catalog name) and returns its event id. The partition
        is the key's unless given."""
        if not telemetry.tracing():  # no span to open: the per-record hot path of every component
            out = encoded(self.topics, self.codec, self.name, topic, event, key)
            self._producer.send(topic, out.value, key=out.key, headers=out.headers, partition=partition)
            return out.event_id
        with outgoing(self.topics, self.codec, self.name, topic, event, key) as out:
            self._producer.send(topic, out.value, key=out.key, headers=out.headers, partition=partition)
        return out.event_id

    def send_tombstone(self, topic: str, *, key: str | bytes, partition: int | None = None) -> None:
        """Queues a tombstone for `key` on a compacted topic: compaction then forgets the key."""
        if self.topics.spec(topic).cleanup != "compact":
            raise ConfigError(f"tombstones only make sense on compacted topics, not {topic}")
        self._producer.send(topic, None, key=key.encode() if isinstance(key, str) else key, partition=partition)

    def flush(self, timeout_s: float | None = None) -> None:
        self._producer.flush(timeout_s)

    def close(self) -> None:
        self._producer.close()


def dead_letter_for(record: Record, error: BaseException | str, *, stage: DeadLetterStage, component: str) -> DeadLetter:
    """The dead letter for `record`: its origin, (truncated) bytes and the error; logs a warning."""
    error_type = type(error).__name__ if isinstance(error, BaseException) else "Rejected"
    value = record.value or b""
    logger.warning("dead-lettered %s[%d]@%d in %s: %s: %s", record.topic, record.partition, record.offset,
                   component, error_type, error)
    return DeadLetter(source_topic=record.topic, partition=record.partition, offset=record.offset,
                      key=record.key, raw=value[:RAW_BYTES_KEPT], raw_size=len(value), stage=stage,
                      error_type=error_type, error=str(error), component=component)


class DeadLetters:
    """Writes records a component could not use to the dead-letter topic, with the reason."""

    def __init__(self, producer: EventProducer, component: str) -> None:
        self._producer, self.component = producer, component
        self.count = 0

    def send(self, record: Record, error: BaseException | str, *, stage: DeadLetterStage = "process") -> None:
        letter = dead_letter_for(record, error, stage=stage, component=self.component)
        self._producer.send(self._producer.topics.deadletter, letter, key=record.topic)
        self.count += 1

    def flush(self) -> None:
        self._producer.flush()


class HeldDeadLetters(DeadLetters):
    """For readers that must not write (inspection, or a replay that has not yet decided to): the
    records they cannot decode are kept here, to show or to send later with `release`."""

    def __init__(self, component: str = "reader") -> None:
        self.component, self.count = component, 0
        self.held: list[tuple[Record, BaseException | str, DeadLetterStage]] = []

    def send(self, record: Record, error: BaseException | str, *, stage: DeadLetterStage = "process") -> None:
        self.held.append((record, error, stage))
        self.count += 1

    def flush(self) -> None:
        pass

    def release(self, to: DeadLetters) -> None:
        for record, error, stage in self.held:
            to.send(record, error, stage=stage)
        self.held = []


def decoded(record: Record, codec: Codec, dead_letters: DeadLetters) -> Delivery | None:
    """The record's event, or None: for a tombstone (it deletes a key, it carries no event), or
    for bytes that do not decode, which go to `dead_letters`."""
    if record.value is None:
        return None
    try:
        return Delivery(envelope=codec.decode(record.value), record=record)
    except SchemaError as exc:
        dead_letters.send(record, exc, stage="decode")
        return None


class EventConsumer:
    """Polls records and yields decoded events; undecodable records go to the dead-letter topic."""

    def __init__(self, consumer: Consumer, dead_letters: DeadLetters, *, codec: Codec | None = None,
                 group: str | None = None) -> None:
        self._consumer, self.dead_letters, self.group = consumer, dead_letters, group
        self.codec = codec or Codec()

    def poll_batch(self, max_records: int, timeout_s: float = 1.0) -> list[Delivery]:
        """Up to `max_records` decoded events (see `Consumer.poll_batch`); bad records are
        dead-lettered and left out, so the list can be shorter than what was read."""
        return [d for _, d in self.poll_records(max_records, timeout_s) if d is not None]

    def poll_records(self, max_records: int, timeout_s: float = 1.0) -> list[tuple[Record, Delivery | None]]:
        """Like `poll_batch`, with every record read: its delivery, or None for a tombstone or a
        record that was dead-lettered (for callers that track positions)."""
        return [(record, decoded(record, self.codec, self.dead_letters))
                for record in self._consumer.poll_batch(max_records, timeout_s)]

    def poll(self, timeout_s: float = 1.0) -> Delivery | None:
        batch = self.poll_batch(1, timeout_s)
        return batch[0] if batch else None

    def dead_letter(self, delivery: Delivery | Record, error: BaseException | str) -> None:
        """Sends a valid event this component cannot use to the dead-letter topic."""
        record = delivery.record if isinstance(delivery, Delivery) else delivery
        self.dead_letters.send(record, error, stage="process")

    def process_span(self, delivery: Delivery):
        """A `process <topic>` span for one delivery, child of its producer's span."""
        if not telemetry.tracing():
            return nullcontext()
        r = delivery.record
        return telemetry.process_span(r.topic, r.partition, r.offset, r.headers, self.group,
                                      **{"messaging.message.id": delivery.envelope.event_id})

    def commit(self, deliveries: Sequence[Delivery] | None = None) -> None:
        """Flushes dead letters, then commits past `deliveries` (default: everything polled,
        dead-lettered records included)."""
        self.dead_letters.flush()
        self._consumer.commit(None if deliveries is None else [d.record for d in deliveries])

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Flushes dead letters, then commits `offsets` (the next offset to read per partition)."""
        self.dead_letters.flush()
        self._consumer.commit_offsets(offsets)

    def read_offsets(self) -> dict[tuple[str, int], int]:
        """Per assigned partition, the offset after the last record read: decoded, dead-lettered or
        a tombstone."""
        return self._consumer.consumed_offsets()

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs the underlying consumer reads now."""
        return self._consumer.assignment()

    def close(self) -> None:
        self._consumer.close()


def records_to_end(log: EventLog, topics: Sequence[str], *, timeout_s: float = 30.0,
                   start: Mapping[tuple[str, int], int] | None = None) -> Iterator[Record]:
    """Every record on `topics` (tombstones included, nothing decoded) from `start` (default: the
    beginning) up to the end offsets each partition had when called. A reader outside any group,
    so a scan registers nothing on the broker. Raises `TimeoutError` when the log stops answering
    short of those offsets for `timeout_s`."""
    ends = {(t, p): end for t in topics for p, end in log.end_offsets(t).items()}
    starts = {tp: (start or {}).get(tp, 0) for tp in ends}
    remaining = {tp for tp, end in ends.items() if end > starts[tp]}
    if not remaining:
        return
    reader = log.reader(list(topics), AtOffsets(starts))
    try:
        while remaining:
            records = reader.poll_batch(1000, timeout_s)
            if not records:
                raise TimeoutError(f"reading {', '.join(topics)} stalled short of the end offsets {ends}")
            for record in records:
                tp = (record.topic, record.partition)
                if record.offset >= ends[tp]:
                    remaining.discard(tp)
                    continue
                yield record
                if record.offset >= ends[tp] - 1:
                    remaining.discard(tp)
    finally:
        reader.close()


def read_to_end(log: EventLog, topics: Sequence[str], dead_letters: DeadLetters, *, timeout_s: float = 30.0,
                start: Mapping[tuple[str, int], int] | None = None) -> Iterator[Delivery]:
    """Every decodable event of `records_to_end`; bad records are dead-lettered."""
    codec = Codec()
    for record in records_to_end(log, topics, timeout_s=timeout_s, start=start):
        delivery = decoded(record, codec, dead_letters)
        if delivery is not None:
            yield delivery


class Follower:
    """Hands every event on `topics` to `on_event`, from the beginning and then as they come, in a
    background thread: the way a component keeps a small view of the log current (the fleet, the
    serving decisions). A record that does not decode is logged and skipped (the topic's own
    consumers dead-letter it); the view goes on. `caught_up` is set once a poll finds nothing new."""

    def __init__(self, log: EventLog, topics: Sequence[str], on_event: Callable[[Event], None], *, name: str,
                 poll_s: float = 0.5) -> None:
        from rollwire.core.bus.base import Beginning
        self.caught_up = threading.Event()
        self._stop = threading.Event()
        self._reader = log.reader(list(topics), Beginning())
        self._on_event, self._poll_s = on_event, poll_s
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        codec = Codec()
        try:
            while not self._stop.is_set():
                records = self._reader.poll_batch(1000, self._poll_s)
                for record in records:
                    if record.value is None:
                        continue
                    try:
                        event = codec.decode(record.value).event
                    except SchemaError as exc:
                        logger.warning("%s@%s does not decode: %s", record.topic, record.offset, exc)
                        continue
                    self._on_event(event)
                if not records:
                    self.caught_up.set()
        finally:
            self._reader.close()

    def wait(self, timeout_s: float = 10.0) -> bool:
        """Waits until everything there was at start has been handed over (up to `timeout_s`)."""
        return self.caught_up.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
