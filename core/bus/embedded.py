"""The embedded event log: Kafka's semantics on local disk, with no server to start.

    EmbeddedLog(root) ── topics in <root>/topics/*.sqlite   (embedded_store)
                     └─ consumer groups in <root>/groups.sqlite  (embedded_groups)

Any number of processes on one machine may produce and consume at once. Producers buffer
records and append them in one transaction per topic when the buffer fills, after `linger_s`
(a background thread), or on `flush`. Consumers poll SQLite; readers never block writers.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

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
from rollwire.core.bus.embedded_groups import GroupMember, committed_offsets
from rollwire.core.bus.embedded_store import Append, TopicFile, topic_names
from rollwire.core.bus.embedded_wakeup import TopicWatch
from rollwire.core.bus.errors import BusError, DeliveryError, TopicError
from rollwire.core.bus.partitioner import partition_for

logger = logging.getLogger(__name__)

_MAX_WAIT_S = 1.0
"""Longest a consumer sleeps between two looks at its topics, woken or not: a safety net, should a
wake-up ever be lost (say, a bell file deleted under a running log)."""

_CLEAN_EVERY = 1000
"""Appended records between two compaction or retention passes of a topic."""


class EmbeddedProducer(Producer):
    def __init__(self, root: Path, *, linger_s: float = 0.005, batch_records: int = 1000,
                 fsync: bool = False) -> None:
        self._root, self._fsync = root, fsync
        self._linger_s, self._batch_records = linger_s, batch_records
        self._files: dict[str, TopicFile] = {}
        self._buffer: list[tuple[str, Append]] = []
        self._failures: list[tuple[str, bytes | None, str]] = []
        self._since_clean: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()         # guards _buffer and _failures
        self._write_lock = threading.Lock()   # one append at a time from this producer
        self._wake = threading.Event()
        self._closed = False
        self._flusher = threading.Thread(target=self._linger_loop, name="embedded-producer", daemon=True)
        self._flusher.start()

    def _file(self, topic: str) -> TopicFile:
        if topic not in self._files:
            self._files[topic] = TopicFile(self._root, topic, fsync=self._fsync)
        return self._files[topic]

    def send(self, topic: str, value: bytes | None, *, key: bytes | None = None, headers: Headers = (),
             timestamp_ms: int | None = None, partition: int | None = None) -> None:
        if self._closed:
            raise BusError("send() on a closed producer")
        file = self._file(topic)
        if partition is None:
            partition = partition_for(key, file.meta.partitions)
        elif not 0 <= partition < file.meta.partitions:
            raise TopicError(f"{topic} has partitions 0..{file.meta.partitions - 1}, not {partition}")
        record = Append(partition=partition, key=key, value=value,
                        headers=tuple(headers), timestamp_ms=timestamp_ms or time.time_ns() // 1_000_000)
        with self._lock:
            self._buffer.append((topic, record))
            full = len(self._buffer) >= self._batch_records
        if full:
            self._write_buffer()
        elif not self._wake.is_set():  # set() takes a lock; most sends find it set already
            self._wake.set()

    def _linger_loop(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            time.sleep(self._linger_s)
            self._write_buffer()

    def _write_buffer(self) -> None:
        with self._write_lock:
            with self._lock:
                pending, self._buffer = self._buffer, []
            by_topic: dict[str, list[Append]] = collections.defaultdict(list)
            for topic, record in pending:
                reason = self._reject_reason(topic, record)
                if reason:
                    with self._lock:
                        self._failures.append((topic, record.key, reason))
                else:
                    by_topic[topic].append(record)
            for topic, records in by_topic.items():
                try:
                    self._files[topic].append(records)
                except Exception as exc:  # the disk or file failed: report every record, keep going
                    with self._lock:
                        self._failures.extend((topic, r.key, f"{type(exc).__name__}: {exc}") for r in records)
                    continue
                self._since_clean[topic] += len(records)
                meta = self._files[topic].meta
                if self._since_clean[topic] >= _CLEAN_EVERY and (meta.compacted or meta.retention_ms):
                    self._since_clean[topic] = 0
                    try:
                        self._files[topic].clean()
                    except Exception:  # cleaning is an optimisation: the next pass retries
                        logger.warning("cleaning %s failed", topic, exc_info=True)

    def _reject_reason(self, topic: str, record: Append) -> str | None:
        meta = self._files[topic].meta
        if meta.compacted and record.key is None:
            return f"{topic} is compacted: every record needs a key"
        if record.value is not None and len(record.value) > meta.max_message_bytes:
            return (f"record of {len(record.value)} bytes is over {topic}'s max_message_bytes "
                    f"{meta.max_message_bytes}")
        return None

    def flush(self, timeout_s: float | None = None) -> None:
        self._write_buffer()
        with self._lock:
            failures, self._failures = self._failures, []
        if failures:
            shown = "; ".join(f"{t} key={k!r}: {why}" for t, k, why in failures[:5])
            raise DeliveryError(f"{len(failures)} record(s) were not written: {shown}", failures)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._wake.set()
            self._flusher.join()
            for file in self._files.values():
                file.close()


class EmbeddedConsumer(Consumer):
    """A group member (`group_id` set) or a reader (`start` set)."""

    def __init__(self, root: Path, topics: Sequence[str], *, group_id: str | None = None,
                 reset: OffsetReset = "earliest", session_timeout_s: float = 10.0,
                 start: StartAt | None = None, fetch_records: int = 500) -> None:
        if not topics:
            raise BusError("a consumer needs at least one topic")
        self._files = {t: TopicFile(root, t) for t in topics}
        self._watch = TopicWatch(root / "topics", topics)
        self._reset, self._fetch_records = reset, fetch_records
        self._positions: dict[tuple[str, int], int] = {}   # next offset to fetch
        self._consumed: dict[tuple[str, int], int] = {}    # offset after the last record returned
        self._buffer: collections.deque[Record] = collections.deque()
        self._member: GroupMember | None = None
        self._next_refresh = 0.0
        self._cursor = 0
        if group_id is not None:
            partitions = {t: f.meta.partitions for t, f in self._files.items()}
            self._member = GroupMember(root, group_id, partitions, session_timeout_s)
            self._refresh_interval = min(0.1, session_timeout_s / 10)
        else:
            for topic, file in self._files.items():
                for p in range(file.meta.partitions):
                    self._positions[(topic, p)] = self._start_offset(file, p, start or Beginning())

    @staticmethod
    def _start_offset(file: TopicFile, partition: int, start: StartAt) -> int:
        if isinstance(start, Beginning):
            return file.first_offset(partition)
        if isinstance(start, AtTime):
            return file.offset_for_time(partition, start.timestamp_ms)
        if isinstance(start, AtOffsets):
            offset = start.offsets.get((file.name, partition))
            return offset if offset is not None else file.end_offsets()[partition]
        raise TypeError(f"unknown start position {start!r}")

    def _refresh_assignment(self) -> None:
        if self._member is None or time.monotonic() < self._next_refresh:
            return
        self._next_refresh = time.monotonic() + self._refresh_interval
        owned = set(self._member.refresh())
        if owned == set(self._positions):
            return
        committed = self._member.committed()
        for tp in owned - set(self._positions):
            file = self._files[tp[0]]
            if tp in committed:
                self._positions[tp] = committed[tp]
            elif self._reset == "earliest":
                self._positions[tp] = file.first_offset(tp[1])
            else:
                self._positions[tp] = file.end_offsets()[tp[1]]
        for tp in set(self._positions) - owned:
            del self._positions[tp]
            self._consumed.pop(tp, None)
        self._buffer = collections.deque(r for r in self._buffer if (r.topic, r.partition) in owned)

    def _fetch(self) -> None:
        assigned = sorted(self._positions)
        for i in range(len(assigned)):
            tp = assigned[(self._cursor + i) % len(assigned)]
            records = self._files[tp[0]].read(tp[1], self._positions[tp], self._fetch_records)
            if records:
                self._positions[tp] = records[-1].offset + 1
                self._buffer.extend(records)
                self._cursor = (self._cursor + i + 1) % len(assigned)
                return

    def poll_batch(self, max_records: int, timeout_s: float = 1.0) -> list[Record]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._refresh_assignment()
            if not self._buffer and self._positions:
                self._fetch()
            if self._buffer:
                self._watch.woke()
                batch = [self._buffer.popleft() for _ in range(min(max_records, len(self._buffer)))]
                for r in batch:
                    self._consumed[(r.topic, r.partition)] = r.offset + 1
                return batch
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            # Woken by an append to one of our topics; a group member also looks at its assignment.
            self._watch.wait(min(remaining, self._refresh_interval if self._member else _MAX_WAIT_S))

    def consumed_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self._consumed)

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        if self._member is None:
            raise BusError("a reader has no group to commit to: use EventLog.consumer(group_id=...)")
        if offsets:
            self._member.commit(offsets)

    def assignment(self) -> list[tuple[str, int]]:
        self._refresh_assignment()
        return sorted(self._positions)

    def close(self) -> None:
        if self._member is not None:
            self._member.leave()
            self._member = None
        self._watch.close()
        for file in self._files.values():
            file.close()
        self._files = {}


class EmbeddedLog(EventLog):
    """The event log in a local directory (created if missing)."""

    def __init__(self, root: str | Path, *, fsync: bool = False) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync

    def create_topics(self, topics: Iterable[TopicConfig]) -> None:
        for config in topics:
            TopicFile.create(self.root, config)

    def topics(self) -> list[str]:
        return list(topic_names(self.root))

    def partitions(self, topic: str) -> int:
        file = TopicFile(self.root, topic)
        try:
            return file.meta.partitions
        finally:
            file.close()

    def producer(self) -> EmbeddedProducer:
        return EmbeddedProducer(self.root, fsync=self._fsync)

    def consumer(self, topics: Sequence[str], group_id: str, *, reset: OffsetReset = "earliest",
                 session_timeout_s: float = 10.0) -> EmbeddedConsumer:
        if not group_id:
            raise BusError("a group consumer needs a non-empty group_id")
        return EmbeddedConsumer(self.root, topics, group_id=group_id, reset=reset,
                                session_timeout_s=session_timeout_s)

    def reader(self, topics: Sequence[str], start: StartAt = Beginning()) -> EmbeddedConsumer:
        return EmbeddedConsumer(self.root, topics, start=start)

    def end_offsets(self, topic: str) -> dict[int, int]:
        file = TopicFile(self.root, topic)
        try:
            return file.end_offsets()
        finally:
            file.close()

    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        if topic not in self.topics():
            raise TopicError(f"topic {topic!r} does not exist in {self.root}")
        return committed_offsets(self.root, group_id, topic)

    def close(self) -> None:
        pass
