"""The event-log contract, run against the embedded log and a real Kafka broker alike."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from rollwire.core.bus import AtOffsets, AtTime, Beginning, DeliveryError, EventLog, TopicError
from rollwire.core.bus.partitioner import partition_for
from rollwire.core.metrics import LagProbe

CHILD = str(Path(__file__).resolve().parent.parent / "bus_child.py")


def produce(log: EventLog, topic: str, items: list[tuple[bytes | None, bytes]]) -> None:
    with log.producer() as producer:
        for key, value in items:
            producer.send(topic, value, key=key)
        producer.flush()


def read_all(log: EventLog, topic: str, expected: int, start=Beginning(), timeout_s: float = 20.0):
    records = []
    deadline = time.monotonic() + timeout_s
    with log.reader([topic], start) as reader:
        while len(records) < expected and time.monotonic() < deadline:
            records.extend(reader.poll_batch(500, 0.5))
        records.extend(reader.poll_batch(500, 0.3))  # anything beyond `expected` is a failure too
    return records


def drain(consumer, expected: int, timeout_s: float = 30.0):
    records = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        records.extend(consumer.poll_batch(expected - len(records), 0.5))
    return records


def test_records_keep_their_order_per_key_on_the_kafka_partition(log, new_topic):
    topic = new_topic(partitions=3)
    keys = [f"group-{k}".encode() for k in range(6)]
    produce(log, topic, [(keys[i % 6], f"{i % 6}:{i // 6}".encode()) for i in range(600)])

    records = read_all(log, topic, 600)

    assert len(records) == 600
    by_key = defaultdict(list)
    for r in records:
        assert r.partition == partition_for(r.key, 3), "partition must follow Kafka's murmur2"
        by_key[r.key].append(int(r.value.split(b":")[1]))
    assert all(seq == list(range(100)) for seq in by_key.values())
    offsets = defaultdict(list)
    for r in records:
        offsets[r.partition].append(r.offset)
    assert all(offs == list(range(len(offs))) for offs in offsets.values())


def test_uncommitted_records_are_redelivered_after_a_consumer_is_killed(log, new_topic, group_id,
                                                                        bus_settings):
    topic = new_topic()
    produce(log, topic, [(b"k", f"v{i}".encode()) for i in range(20)])

    child = subprocess.run([sys.executable, CHILD, "consume-and-die", bus_settings.model_dump_json(),
                            topic, group_id, "20", "5"], capture_output=True, text=True, timeout=120)
    assert child.returncode == -9 and "read 20" in child.stdout, child.stderr[-2000:]

    with log.consumer([topic], group_id, session_timeout_s=1.0) as consumer:
        again = drain(consumer, 15)
        assert consumer.poll_batch(10, 1.0) == []
    assert [r.value for r in again] == [f"v{i}".encode() for i in range(5, 20)]


def test_a_new_consumer_resumes_from_committed_offsets(log, new_topic, group_id):
    topic = new_topic(partitions=2)
    produce(log, topic, [(f"k{i % 4}".encode(), f"v{i}".encode()) for i in range(40)])

    with log.consumer([topic], group_id) as first:
        records = drain(first, 40)
        first.commit(records[:25])
        committed_values = {r.value for r in records[:25]}
    assert len(records) == 40

    expected = {}
    for r in records[:25]:
        expected[r.partition] = max(expected.get(r.partition, 0), r.offset + 1)
    assert log.committed(group_id, topic) == expected

    with log.consumer([topic], group_id) as second:
        rest = drain(second, 40 - len(committed_values), timeout_s=30)
        assert second.poll_batch(10, 1.0) == []
    assert {r.value for r in rest} == {r.value for r in records} - committed_values


def test_consumer_lag_is_what_a_group_has_not_committed(log, new_topic, group_id):
    topic = new_topic(partitions=2)
    probe = LagProbe(log, [(group_id, topic)])
    produce(log, topic, [(f"k{i % 4}".encode(), f"v{i}".encode()) for i in range(40)])
    assert probe.read() == {(group_id, topic): 40}, "a group that committed nothing lags by everything"

    with log.consumer([topic], group_id) as consumer:
        records = drain(consumer, 40)
        consumer.commit(records[:25])
    lag_after = probe.read()[(group_id, topic)]
    produce(log, topic, [(b"k0", b"later")])

    assert lag_after == 15
    assert probe.read() == {(group_id, topic): 16}, "a new record adds to the lag until it is committed"


def test_replay_from_a_timestamp_or_offset_returns_only_later_records(log, new_topic):
    topic = new_topic(partitions=2)
    produce(log, topic, [(f"k{i}".encode(), b"old") for i in range(10)])
    time.sleep(0.05)
    cutoff_ms = time.time_ns() // 1_000_000
    time.sleep(0.05)
    produce(log, topic, [(f"k{i}".encode(), b"new") for i in range(10)])

    since = read_all(log, topic, 10, start=AtTime(cutoff_ms))
    assert [r.value for r in since] == [b"new"] * 10
    assert all(r.timestamp_ms >= cutoff_ms for r in since)

    everything = read_all(log, topic, 20)
    last = {r.partition: r.offset for r in everything}
    tail = read_all(log, topic, 2, start=AtOffsets({(topic, p): o for p, o in last.items()}))
    assert sorted((r.partition, r.offset) for r in tail) == sorted(last.items())


def test_a_compacted_topic_gives_the_latest_record_per_key(log, new_topic):
    topic = new_topic(partitions=2, compacted=True)
    produce(log, topic, [(f"policy-{k}".encode(), f"v{version}".encode())
                         for version in range(5) for k in range(3)])

    produce(log, topic, [(b"policy-1", None)])  # a tombstone deletes the key

    latest = log.latest_per_key(topic)

    assert {k: r.value for k, r in latest.items()} == {b"policy-0": b"v4", b"policy-2": b"v4"}
    with log.producer() as producer:
        producer.send(topic, b"no key")
        with pytest.raises(DeliveryError, match="key"):
            producer.flush()


def test_two_producer_processes_write_concurrently_without_loss_or_duplicates(log, new_topic,
                                                                             bus_settings):
    topic = new_topic(partitions=3)
    children = [subprocess.Popen([sys.executable, CHILD, "produce", bus_settings.model_dump_json(),
                                  topic, name, "500"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for name in ("A", "B")]
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-2000:]

    records = read_all(log, topic, 1000)

    values = [r.value.decode() for r in records]
    assert len(values) == 1000 and len(set(values)) == 1000
    by_key = defaultdict(list)
    for r in records:
        by_key[r.key].append(int(r.value.split(b":")[1]))
    assert all(seq == sorted(seq) for seq in by_key.values())
    per_partition = defaultdict(list)
    for r in records:
        per_partition[r.partition].append(r.offset)
    assert all(sorted(o) == list(range(len(o))) for o in per_partition.values())


def test_members_of_a_group_share_partitions_and_read_each_record_once(log, new_topic, group_id):
    topic = new_topic(partitions=4)
    a = log.consumer([topic], group_id, session_timeout_s=2.0)
    b = log.consumer([topic], group_id, session_timeout_s=2.0)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            a.poll_batch(1, 0.2), b.poll_batch(1, 0.2)
            if len(a.assignment()) + len(b.assignment()) == 4 and a.assignment() and b.assignment():
                break
        assert set(a.assignment()).isdisjoint(b.assignment())
        assert len(a.assignment()) + len(b.assignment()) == 4

        produce(log, topic, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(200)])
        got_a, got_b = [], []
        deadline = time.monotonic() + 30
        while len(got_a) + len(got_b) < 200 and time.monotonic() < deadline:
            got_a += a.poll_batch(100, 0.2)
            got_b += b.poll_batch(100, 0.2)
    finally:
        a.close()
        b.close()
    assert got_a and got_b
    assert sorted(r.value for r in got_a + got_b) == sorted(f"v{i}".encode() for i in range(200))


def test_missing_topics_and_oversized_records_are_reported(log, new_topic, group_id):
    with log.producer() as producer:
        with pytest.raises(TopicError, match="create it first"):
            producer.send("no-such-topic-anywhere", b"x")
    with pytest.raises(TopicError):
        log.consumer(["no-such-topic-anywhere"], group_id)

    small = new_topic(max_message_bytes=10_000)
    with log.producer() as producer:
        producer.send(small, os.urandom(50_000), key=b"k")  # incompressible: lz4 cannot shrink it
        with pytest.raises(DeliveryError) as caught:
            producer.flush()
        assert len(caught.value.failures) == 1
        producer.send(small, b"fits", key=b"k")  # the producer goes on after a failed record
    assert [r.value for r in read_all(log, small, 1)] == [b"fits"]


def test_a_waiting_reader_wakes_when_another_process_appends(log, new_topic, bus_settings):
    topic = new_topic(partitions=2)
    with log.reader([topic], AtOffsets({})) as reader:  # at the end: nothing to read yet
        assert reader.poll_batch(10, 0.2) == []
        child = subprocess.Popen([sys.executable, CHILD, "produce", bus_settings.model_dump_json(), topic, "late", "1"],
                                 stdout=subprocess.DEVNULL)
        started = time.monotonic()
        batch = reader.poll_batch(10, 60.0)
        waited = time.monotonic() - started
        child.wait(timeout=60)
    assert [r.value for r in batch] == [b"late:0"]
    assert waited < 30, "the reader slept through the append until its timeout"


def test_a_record_sent_to_a_partition_lands_there_whatever_its_key(log, new_topic):
    topic = new_topic(3)
    with log.producer() as producer:
        for p in range(3):
            producer.send(topic, f"v{p}".encode(), key=b"same-key", partition=p)
        producer.flush()
    records = read_all(log, topic, 3)
    assert sorted((r.partition, r.value) for r in records) == [(0, b"v0"), (1, b"v1"), (2, b"v2")]


@pytest.mark.kafka
def test_scans_register_no_consumer_group_on_the_broker(bus_settings_kafka, topics):
    from confluent_kafka.admin import AdminClient

    from rollwire.core.bus import DeadLetters, EventProducer, catalog_topics, open_log, read_to_end
    admin = AdminClient({"bootstrap.servers": bus_settings_kafka.bootstrap_servers})

    def groups() -> set[str]:
        return {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid}

    log = open_log(bus_settings_kafka)
    log.create_topics(catalog_topics(topics))
    before = groups()
    producer = EventProducer(log.producer(), topics, name="test")
    produce(log, topics.rollouts, [(b"k", b"not an event")])
    list(read_to_end(log, [topics.rollouts], DeadLetters(producer, "test")))
    read_all(log, topics.rollouts, 1)
    log.latest_per_key(topics.rollouts)
    log.end_offsets(topics.rollouts)
    producer.close()
    log.close()
    # Other tests' groups may show up meanwhile (the broker is shared); a scan's own would be named
    # after its reader (`rollwire-reader-...`) or carry this test's prefix.
    assert [g for g in groups() - before if g.startswith("rollwire-reader-") or topics.prefix in g] == []
