"""The Kafka log's end offsets across a broker restart (no broker needed: a client stand-in answers
as librdkafka did in the chaos run): a partition the client's metadata lost a moment is asked
again, and what stays wrong reaches the log's callers as a BusError, which the run's stall watch
tolerates, never as a raw KafkaException that ended `rollwire run`."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from rollwire.core.bus import BusError
from rollwire.core.bus.kafka import _high_watermark


class Restarting:
    """A consumer whose metadata lost the partition for its first `lost` asks."""

    def __init__(self, lost: int) -> None:
        self.lost, self.asked = lost, 0

    def get_watermark_offsets(self, partition, timeout):
        self.asked += 1
        if self.asked <= self.lost:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, "Failed to get watermark offsets"))
        return 0, 42


def test_a_partition_lost_for_a_moment_after_a_restart_is_asked_again():
    consumer = Restarting(lost=3)
    assert _high_watermark(consumer, TopicPartition("t", 0), settle_s=5) == 42
    assert consumer.asked == 4


def test_end_offsets_turn_what_stays_wrong_into_a_bus_error(monkeypatch):
    from rollwire.core.bus.kafka import KafkaLog
    log = KafkaLog.__new__(KafkaLog)  # no broker: only end_offsets' own path runs
    log._outage_s, log._refused = 1.0, None
    monkeypatch.setattr(KafkaLog, "_metadata_consumer", lambda self: Restarting(lost=10**9))
    monkeypatch.setattr("rollwire.core.bus.kafka._topic_exists", lambda *args: 1)
    monkeypatch.setattr("rollwire.core.bus.kafka._high_watermark", lambda consumer, tp: consumer.get_watermark_offsets(tp, 1)[1])
    with pytest.raises(BusError, match="end offsets of 'rw.scored'.*watermark"):
        log.end_offsets("rw.scored")
