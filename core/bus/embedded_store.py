"""Storage of the embedded event log: one SQLite file per topic, safe across processes.

    <root>/topics/<topic>.bell                   rung after every committed append (`embedded_wakeup`)
    <root>/topics/<topic>.sqlite
        config(name, value)                      partitions, compacted, retention_ms, max_message_bytes
        partitions(partition, next_offset)       the high watermark of each partition
        records(partition, offset, timestamp_ms, key, value, headers)

SQLite in WAL mode gives what the log needs without a server: appends are transactions (one
writer at a time per topic, readers never blocked), offsets are assigned inside the append
transaction, so concurrent producers in several processes never share an offset. With
`synchronous=NORMAL` a committed append survives a process crash; `fsync=True` also makes it
survive power loss, at a cost per flush.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgpack

from rollwire.core.bus.base import Record, TopicConfig
from rollwire.core.bus.embedded_wakeup import Doorbell
from rollwire.core.bus.errors import TopicError

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS config (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS partitions (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    key BLOB,
    value BLOB,
    headers BLOB,
    PRIMARY KEY (partition, offset)
);
CREATE INDEX IF NOT EXISTS records_by_time ON records (partition, timestamp_ms);
"""


TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000
"""How long a compacted topic keeps a tombstone, so readers behind see the deletion (Kafka's
`delete.retention.ms` default); after that the key is simply gone."""


def connect(path: Path, *, fsync: bool = False) -> sqlite3.Connection:
    """An autocommit connection; writers open their own `BEGIN IMMEDIATE` transactions."""
    conn = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


def validate_topic_name(name: str) -> None:
    if not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise TopicError(f"topic name {name!r} is invalid: use 1-249 of letters, digits, '.', '_', '-'")


@dataclass(frozen=True)
class TopicMeta:
    partitions: int
    compacted: bool
    retention_ms: int | None
    max_message_bytes: int


@dataclass(slots=True)
class Append:
    """One record to append; its partition is already chosen."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


class TopicFile:
    """One topic's SQLite file, opened by one producer or consumer."""

    def __init__(self, root: Path, name: str, *, fsync: bool = False) -> None:
        validate_topic_name(name)
        self.name = name
        self.path = root / "topics" / f"{name}.sqlite"
        if not self.path.exists():
            raise TopicError(f"topic {name!r} does not exist in {root}: create it first "
                             "(EventLog.create_topics, or `rollwire topics --create`)")
        self.conn = connect(self.path, fsync=fsync)
        self._bell: Doorbell | None = None
        self._written: dict[tuple[int, bytes | None], int] = {}
        """Compacted topics: the newest offset this file appended per (partition, key) whose older
        records `clean` has not yet removed."""
        self._head: dict[int, int] = {}
        """Compacted topics: end offsets at the last `clean`; records from there on are the head."""
        rows = dict(self.conn.execute("SELECT name, value FROM config").fetchall())
        if "partitions" not in rows:
            raise TopicError(f"topic {name!r} is being created or its file is damaged: {self.path}")
        self.meta = TopicMeta(
            partitions=int(rows["partitions"]), compacted=rows["compacted"] == "1",
            retention_ms=int(rows["retention_ms"]) if rows["retention_ms"] else None,
            max_message_bytes=int(rows["max_message_bytes"]))

    @staticmethod
    def create(root: Path, config: TopicConfig) -> None:
        """Creates the topic file if absent; a concurrent creator's settings win, as in Kafka."""
        validate_topic_name(config.name)
        if config.partitions < 1:
            raise TopicError(f"topic {config.name!r} needs at least 1 partition, got {config.partitions}")
        (root / "topics").mkdir(parents=True, exist_ok=True)
        conn = connect(root / "topics" / f"{config.name}.sqlite")
        try:
            conn.executescript(_SCHEMA)
            if config.compacted:
                conn.execute("CREATE INDEX IF NOT EXISTS records_by_key ON records (partition, key, offset)")
            conn.execute("BEGIN IMMEDIATE")
            values = {"partitions": str(config.partitions), "compacted": "1" if config.compacted else "0",
                      "retention_ms": str(config.retention_ms or ""),
                      "max_message_bytes": str(config.max_message_bytes)}
            if conn.execute("SELECT COUNT(*) FROM config").fetchone()[0] == 0:
                conn.executemany("INSERT INTO config VALUES (?, ?)", values.items())
                conn.executemany("INSERT INTO partitions VALUES (?, 0)",
                                 [(p,) for p in range(config.partitions)])
            conn.execute("COMMIT")
        finally:
            conn.close()

    def append(self, records: Sequence[Append]) -> None:
        """Appends `records` in one transaction, assigning consecutive offsets per partition."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            next_offset = dict(conn.execute("SELECT partition, next_offset FROM partitions"))
            rows = []
            for r in records:
                offset = next_offset[r.partition]
                next_offset[r.partition] = offset + 1
                headers = msgpack.packb(r.headers, use_bin_type=True) if r.headers else None
                rows.append((r.partition, offset, r.timestamp_ms, r.key, r.value, headers))
            conn.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)", rows)
            conn.executemany("UPDATE partitions SET next_offset = ? WHERE partition = ?",
                             [(o, p) for p, o in next_offset.items()])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if self.meta.compacted:
            self._written.update(((p, k), o) for p, o, _, k, _, _ in rows)
        self._doorbell().ring()  # after the commit: a consumer woken now sees the records

    def clean(self) -> None:
        """Applies retention (drops records older than `retention_ms`), or compaction.

        Compaction works as Kafka's does, and costs what was written since the last pass, not the
        size of the topic: for each key this file appended, the records older than its newest
        are deleted, except in the head, the records appended since the previous pass, which a
        consumer keeping up reads whole. Tombstones go after `TOMBSTONE_RETENTION_MS`."""
        now = time.time_ns() // 1_000_000
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self.meta.compacted:
                head = self._head
                conn.executemany("DELETE FROM records WHERE partition = ? AND key = ? AND offset < ?",
                                 [(p, k, min(o, head.get(p, 0))) for (p, k), o in self._written.items()])
            for partition in range(self.meta.partitions):  # by partition, so the time index serves
                if self.meta.compacted:
                    conn.execute(  # a tombstone goes only once nothing older of its key is left to revive
                        "DELETE FROM records WHERE partition = ? AND timestamp_ms < ? AND value IS NULL AND NOT EXISTS "
                        "(SELECT 1 FROM records AS o WHERE o.partition = records.partition AND o.key = records.key "
                        "AND o.offset < records.offset)", (partition, now - TOMBSTONE_RETENTION_MS))
                elif self.meta.retention_ms is not None:
                    conn.execute("DELETE FROM records WHERE partition = ? AND timestamp_ms < ?",
                                 (partition, now - self.meta.retention_ms))
            ends = self.end_offsets()
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if self.meta.compacted:  # keys whose older records lie in the head: again next pass
            self._written = {(p, k): o for (p, k), o in self._written.items() if o >= head.get(p, 0)}
            self._head = ends

    def end_offsets(self) -> dict[int, int]:
        return dict(self.conn.execute("SELECT partition, next_offset FROM partitions"))

    def first_offset(self, partition: int) -> int:
        """The smallest offset still stored (the end offset when the partition is empty)."""
        row = self.conn.execute("SELECT MIN(offset) FROM records WHERE partition = ?", (partition,)).fetchone()
        if row[0] is not None:
            return row[0]
        return self.end_offsets()[partition]

    def offset_for_time(self, partition: int, timestamp_ms: int) -> int:
        """The first offset with timestamp >= `timestamp_ms`, or the end offset if none."""
        row = self.conn.execute("SELECT MIN(offset) FROM records WHERE partition = ? AND timestamp_ms >= ?",
                                (partition, timestamp_ms)).fetchone()
        return row[0] if row[0] is not None else self.end_offsets()[partition]

    def read(self, partition: int, offset: int, limit: int) -> list[Record]:
        rows = self.conn.execute(
            "SELECT offset, timestamp_ms, key, value, headers FROM records "
            "WHERE partition = ? AND offset >= ? ORDER BY offset LIMIT ?", (partition, offset, limit))
        return [Record(topic=self.name, partition=partition, offset=o, key=k, value=v, timestamp_ms=ts,
                       headers=_headers(h)) for o, ts, k, v, h in rows]

    def _doorbell(self) -> Doorbell:
        if self._bell is None:
            self._bell = Doorbell(self.path.parent, self.name)
        return self._bell

    def close(self) -> None:
        if self._bell is not None:
            self._bell.close()
        self.conn.close()


def _headers(blob: bytes | None) -> tuple[tuple[str, bytes], ...]:
    if not blob:
        return ()
    return tuple((k, v) for k, v in msgpack.unpackb(blob, raw=False))


def topic_names(root: Path) -> Iterable[str]:
    folder = root / "topics"
    return sorted(p.stem for p in folder.glob("*.sqlite")) if folder.exists() else []
