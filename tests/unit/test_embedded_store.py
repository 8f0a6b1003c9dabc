"""The embedded log's storage: a compacted topic is compacted as it is written, in work that
does not grow with the topic, keeps its head whole for consumers that keep up, and forgets
tombstones after their retention: a long run's changelog stays bounded."""

from __future__ import annotations

from rollwire.core.bus import Beginning, embedded_store
from rollwire.core.bus.base import TopicConfig
from rollwire.core.bus.embedded import EmbeddedLog


def rows(log: EmbeddedLog, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    file = embedded_store.TopicFile(log.root, topic)
    try:
        return file.conn.execute("SELECT offset, key, value FROM records ORDER BY offset").fetchall()
    finally:
        file.close()


def test_a_compacted_topic_keeps_the_newest_record_per_key_and_its_head_whole(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.create_topics([TopicConfig(name="state", compacted=True)])
    written = 3500  # three compaction passes: after 1000, 2000 and 3000 records
    with log.producer() as producer:
        for i in range(written):
            producer.send("state", f"v{i}".encode(), key=f"k{i % 3}".encode())
            producer.flush()  # one append each, so passes fall exactly every 1000 records
        producer.send("state", None, key=b"k0")
        producer.flush()
    # Each pass compacts up to where the pass before it ended: the last one (at 3000) everything
    # before 2000, where every key has newer records. From 2000 on, the head, nothing is missing.
    assert [o for o, _, _ in rows(log, "state")] == list(range(2000, written + 1))
    assert {r.key: r.value for r in log.latest_per_key("state").values()} == {b"k1": b"v3499", b"k2": b"v3497"}
    with log.reader(["state"], Beginning()) as reader:  # a reader from the start gets the newest of each key
        read = []
        while batch := reader.poll_batch(5000, 0.5):
            read += batch
    assert {r.key for r in read} == {b"k0", b"k1", b"k2"}


def test_tombstones_are_forgotten_after_their_retention_once_nothing_older_is_left(tmp_path, monkeypatch):
    log = EmbeddedLog(tmp_path)
    log.create_topics([TopicConfig(name="state", compacted=True)])
    file = embedded_store.TopicFile(log.root, "state")
    file.append([embedded_store.Append(0, key, value, (), 1) for key, value in
                 [(b"gone", b"v"), (b"kept", b"v"), (b"gone", None)]])
    monkeypatch.setattr(embedded_store, "TOMBSTONE_RETENTION_MS", -1)
    file.clean()  # the first pass: everything is head, and the tombstone would revive b"gone"
    assert [(k, v) for _, k, v in rows(log, "state")] == [(b"gone", b"v"), (b"kept", b"v"), (b"gone", None)]
    file.clean()
    file.close()
    assert [(k, v) for _, k, v in rows(log, "state")] == [(b"kept", b"v")]
