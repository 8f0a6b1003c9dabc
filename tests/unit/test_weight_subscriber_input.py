"""A weight subscriber that meets a record it cannot use (bytes that are no event, an event of
another type) dead-letters it with the reason and keeps following the topic; the engine is never
touched. (No inference server: none is reached.)"""

from __future__ import annotations

from rollwire.consumers.weight_subscriber import WeightSubscriber, WeightSubscriberSettings
from rollwire.core.bus import DeadLetters, EmbeddedBusSettings, EventProducer, catalog_topics, open_log, read_to_end
from rollwire.core.objectstore import LocalStore
from rollwire.schemas import DeadLetter, Topics
from rollwire.schemas.weights import ReplicaStatus


class Untouchable:
    """A vLLM control client that fails the test if the subscriber calls it."""

    def __getattr__(self, name):
        raise AssertionError(f"the engine was touched ({name})")


def test_garbage_on_the_weights_topic_is_dead_lettered_and_the_subscriber_goes_on(tmp_path):
    topics = Topics("w")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    raw = log.producer()
    raw.send(topics.weights, b"\x00garbage", key=b"policy")  # the latest record at start: caught up on
    raw.flush()
    subscriber = WeightSubscriber(log, topics, LocalStore(tmp_path / "store"), Untouchable(),
                                  WeightSubscriberSettings(replica_id="r0", cache_dir=tmp_path / "cache"))
    assert subscriber.catch_up() is None
    raw.send(topics.weights, b"more garbage", key=b"policy")
    raw.flush()
    others = EventProducer(log.producer(), topics, name="confused")
    others._producer.send(topics.weights, others.codec.encode(ReplicaStatus(replica_id="x", state="serving"),
                                                              producer="confused", event_id="e1"), key=b"policy")
    others.flush()
    assert subscriber.poll(timeout_s=2.0) == [] and subscriber.serving is None
    subscriber.close()
    letters = [d.event for d in read_to_end(log, [topics.deadletter], DeadLetters(others, "test"))]
    assert [(letter.component, letter.stage) for letter in letters] == [
        ("replica/r0", "decode"), ("replica/r0", "decode"), ("replica/r0", "process")]
    assert all(isinstance(letter, DeadLetter) and letter.source_topic == topics.weights for letter in letters)
    assert "replica.status event on w.weights, where this replica expects weights.published" in letters[2].error
