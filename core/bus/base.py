"""The event-log interface both backends implement: topics, partitions, keys, offsets, groups.

    EventLog ── create_topics / producer() / consumer(group) / reader(start) / latest_per_key
    Producer ── send(topic, value, key, headers) … flush()        (raises DeliveryError)
    Consumer ── poll() / poll_batch() / commit() / close()

Semantics, as Kafka defines them and the embedded log copies:
- a record's partition is murmur2(key) mod partitions (Java-client compatible); keyless records
  spread over partitions; order holds per partition, so per key;
- offsets count up from 0 per partition; a committed offset is the next offset to read;
- a group consumer owns a share of the partitions; when a member leaves or stops heartbeating
  for `session_timeout_s`, its partitions move and resume from their committed offsets, so
  uncommitted records are delivered again (at-least-once: dedupe downstream on event id);
- a reader has no group: it is assigned every partition from a start position, for replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Headers = Sequence[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Record:
    """One record read from the log."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    """The payload; None for a tombstone (a compacted topic's deletion of `key`)."""
    timestamp_ms: int
    """Create time set by the producer (epoch ms)."""
    headers: tuple[tuple[str, bytes], ...] = ()

    def header(self, name: str) -> bytes | None:
        """The last value of header `name`, or None."""
        for key, value in reversed(self.headers):
            if key == name:
                return value
        return None


@dataclass(frozen=True)
class TopicConfig:
    """What the log needs to create a topic."""

    name: str
    partitions: int = 1
    compacted: bool = False
    """Keep the latest record per key (records need keys) instead of deleting by age."""
    retention_ms: int | None = None
    """Delete records older than this; None keeps them. Ignored for compacted topics."""
    max_message_bytes: int = 2 * 1024 * 1024
    """Largest record the topic accepts."""


@dataclass(frozen=True)
class Beginning:
    """Start from the first record still in each partition."""


@dataclass(frozen=True)
class AtTime:
    """Start, in each partition, at the first record with timestamp >= `timestamp_ms`."""

    timestamp_ms: int


@dataclass(frozen=True)
class AtOffsets:
    """Start each listed partition at its offset; unlisted partitions start at their end."""

    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


StartAt = Beginning | AtTime | AtOffsets
OffsetReset = Literal["earliest", "latest"]


class Producer(ABC):
    """Writes records. `send` buffers; `flush` returns once every buffered record is durable."""

    @abstractmethod
    def send(self, topic: str, value: bytes | None, *, key: bytes | None = None, headers: Headers = (),
             timestamp_ms: int | None = None, partition: int | None = None) -> None:
        """Queues one record (`value=None` is a tombstone for `key`) on `partition`, or on the
        partition of `key` when None. Raises `TopicError` for an unknown topic."""

    @abstractmethod
    def flush(self, timeout_s: float | None = None) -> None:
        """Waits for all queued records; raises `DeliveryError` naming every record that failed.
        `None` waits as long as the log keeps an unsent record (Kafka: while the cluster is away,
        up to the bus's `outage_s`)."""

    @abstractmethod
    def close(self) -> None:
        """Flushes and releases resources."""

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer(ABC):
    """Reads records. A group consumer also commits its position; a reader cannot."""

    @abstractmethod
    def poll_batch(self, max_records: int, timeout_s: float = 1.0) -> list[Record]:
        """Waits up to `timeout_s` for a first record, then returns it with whatever else is
        already fetched, up to `max_records`; an empty list when nothing arrived."""

    def poll(self, timeout_s: float = 1.0) -> Record | None:
        """The next record, or None when none arrived within `timeout_s`."""
        batch = self.poll_batch(1, timeout_s)
        return batch[0] if batch else None

    def commit(self, records: Iterable[Record] | None = None) -> None:
        """Commits, synchronously, the position after each given record (default: after every
        record returned so far). Raises `CommitFailedError` for partitions no longer owned."""
        self.commit_offsets(self.consumed_offsets() if records is None else next_offsets(records))

    @abstractmethod
    def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commits, synchronously, the next offset to read of each (topic, partition) given; an
        empty mapping commits nothing. Raises `CommitFailedError` for partitions no longer owned."""

    @abstractmethod
    def consumed_offsets(self) -> dict[tuple[str, int], int]:
        """Per partition still assigned, the offset after the last record returned so far."""

    @abstractmethod
    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this consumer currently reads."""

    @abstractmethod
    def close(self) -> None:
        """Leaves the group (its partitions move at once) without committing."""

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def next_offsets(records: Iterable[Record]) -> dict[tuple[str, int], int]:
    """Per (topic, partition), the offset after the last of `records`: what a commit stores."""
    offsets: dict[tuple[str, int], int] = {}
    for r in records:
        tp = (r.topic, r.partition)
        offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
    return offsets


class EventLog(ABC):
    """A durable, partitioned, replayable log of records."""

    @abstractmethod
    def create_topics(self, topics: Iterable[TopicConfig]) -> None:
        """Creates the topics that do not exist yet; existing ones are left as they are."""

    @abstractmethod
    def partitions(self, topic: str) -> int:
        """Partition count of `topic`; raises `TopicError` when it does not exist."""

    @abstractmethod
    def producer(self) -> Producer:
        """A new producer."""

    @abstractmethod
    def consumer(self, topics: Sequence[str], group_id: str, *, reset: OffsetReset = "earliest",
                 session_timeout_s: float = 10.0) -> Consumer:
        """A group member reading `topics`; partitions without a committed offset start at `reset`."""

    @abstractmethod
    def reader(self, topics: Sequence[str], start: StartAt = Beginning()) -> Consumer:
        """A consumer outside any group, assigned every partition of `topics` from `start`."""

    @abstractmethod
    def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset the next record will get (the high watermark)."""

    @abstractmethod
    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        """Per partition, the group's committed offset (partitions without one are left out)."""

    def latest_per_key(self, topic: str, timeout_s: float = 30.0) -> dict[bytes, Record]:
        """The newest record of every key, read from the beginning to the current end — the view
        a compacted topic promises (records without a key are skipped; a tombstone removes its key)."""
        ends = self.end_offsets(topic)
        remaining = {p for p, end in ends.items() if end > 0}
        latest: dict[bytes, Record] = {}
        with self.reader([topic], Beginning()) as reader:
            while remaining:
                batch = reader.poll_batch(1000, timeout_s)
                if not batch:
                    raise TimeoutError(f"reading {topic} to its end took over {timeout_s} s")
                for record in batch:
                    if record.key is not None and record.offset < ends[record.partition]:
                        if record.value is None:
                            latest.pop(record.key, None)
                        else:
                            latest[record.key] = record
                    if record.offset >= ends[record.partition] - 1:
                        remaining.discard(record.partition)
        return latest

    @abstractmethod
    def close(self) -> None:
        """Releases the log's resources; producers and consumers should be closed first."""

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
