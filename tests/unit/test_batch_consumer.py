"""The trainer's reader never hands out a rollout further behind than `max_off_policy`, even one
that was fresh when it arrived and waited while the trainer moved on."""

from __future__ import annotations

from builders import trainable

from rollwire.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.consumers.batch_consumer import BatchConsumer, BatchSettings
from rollwire.schemas import Topics


def test_rollouts_that_went_stale_while_pending_are_dropped_not_trained(tmp_path):
    topics = Topics("b")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="scorer")
    for i in range(8):  # sampled at version 0, all on one partition
        producer.send(topics.scored, trainable(i, version=0), key="g")
    producer.flush()
    consumer = BatchConsumer(log, topics, BatchSettings(batch_rollouts=4, max_off_policy=1), vocab_size=82)

    first = consumer.next_batch(policy_version=0)
    assert [s.rollout.rollout_id for s in first.rollouts] == ["r0", "r1", "r2", "r3"]  # r4..r7 wait
    # two steps later those four are 2 versions behind: over the limit, though fresh when they arrived
    assert consumer.next_batch(policy_version=2, timeout_s=0.3) is None
    for i in range(8, 12):
        producer.send(topics.scored, trainable(i, version=2), key="g")
    producer.flush()
    batch = consumer.next_batch(policy_version=2)
    assert [s.rollout.rollout_id for s in batch.rollouts] == ["r8", "r9", "r10", "r11"]
    assert batch.staleness.max == 0 and batch.drops == {"stale": ["r4", "r5", "r6", "r7"]}
    consumer.close()
    producer.close()
