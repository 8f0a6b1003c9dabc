"""Bad records go to the dead-letter topic with their origin and reason; consuming goes on."""

from __future__ import annotations

import time

import msgpack
from builders import rollout

from rollwire.core.bus import DeadLetters, EventConsumer, EventProducer, catalog_topics
from rollwire.schemas import Codec, DeadLetter


def test_undecodable_records_are_dead_lettered_and_the_consumer_keeps_going(log, topics, group_id):
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="test")
    raw = log.producer()
    producer.send(topics.rollouts, rollout(rollout_id="good-1"), key="group-1")
    producer.flush()
    newer = Codec().encode(rollout(), producer="future")
    newer = newer.replace(b"\xaeschema_version\x01", b"\xaeschema_version\x07")
    bad_values = [b"\x00\xff not an event", newer,
                  msgpack.packb({"type": "rollout.completed", "schema_version": 1, "event_id": "x",
                                 "produced_at_ms": 0, "producer": "p", "traceparent": None,
                                 "payload": {"group_id": "g"}})]
    for value in bad_values:
        raw.send(topics.rollouts, value, key=b"group-1")
    raw.flush()
    producer.send(topics.rollouts, rollout(rollout_id="good-2"), key="group-1")
    producer.flush()

    consumer = EventConsumer(log.consumer([topics.rollouts], group_id),
                             DeadLetters(EventProducer(log.producer(), topics, name="scorer"), "scorer"))
    good = []
    deadline = time.monotonic() + 30
    while len(good) < 2 and time.monotonic() < deadline:
        good += consumer.poll_batch(10, 0.5)
    consumer.commit()
    consumer.close()

    assert [d.event.rollout_id for d in good] == ["good-1", "good-2"]
    assert log.committed(group_id, topics.rollouts) == {good[-1].record.partition: 5}

    letters = []
    with log.reader([topics.deadletter]) as reader:
        deadline = time.monotonic() + 30
        while len(letters) < 3 and time.monotonic() < deadline:
            letters += [Codec().decode(r.value).event for r in reader.poll_batch(10, 0.5)]
    assert all(isinstance(d, DeadLetter) for d in letters)
    assert [d.error_type for d in letters] == ["CorruptEventError", "SchemaVersionTooNewError", "InvalidEventError"]
    assert [d.raw for d in letters] == bad_values
    assert [d.offset for d in letters] == [1, 2, 3]
    assert all(d.source_topic == topics.rollouts and d.component == "scorer" and d.stage == "decode"
               and d.key == b"group-1" for d in letters)
    assert "upgrade rollwire" in letters[1].error


def test_a_valid_event_the_component_rejects_is_dead_lettered_with_its_reason(log, topics, group_id):
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="test")
    producer.send(topics.rollouts, rollout(rewards={"exact_match": float("nan")}), key="group-1")
    producer.flush()
    consumer = EventConsumer(log.consumer([topics.rollouts], group_id),
                             DeadLetters(EventProducer(log.producer(), topics, name="scorer"), "scorer"))
    delivery = None
    deadline = time.monotonic() + 30
    while delivery is None and time.monotonic() < deadline:
        delivery = consumer.poll(0.5)
    consumer.dead_letter(delivery, "reward exact_match is NaN")
    consumer.commit()
    consumer.close()

    with log.reader([topics.deadletter]) as reader:
        records = []
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            records = reader.poll_batch(10, 0.5)
    letter = Codec().decode(records[0].value).event
    assert (letter.stage, letter.error, letter.offset) == ("process", "reward exact_match is NaN", 0)
    assert Codec().decode(letter.raw).event.rollout_id == delivery.event.rollout_id
