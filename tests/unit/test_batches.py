"""The trainer's reader never hands out a rollout further behind than `max_off_policy`, even one
that was fresh when it arrived and waited while the trainer moved on."""

from __future__ import annotations

from builders import production, trainable

from rollwire.core.bus import AtOffsets, EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.schemas import Topics
from rollwire.schemas.base import now_ms
from rollwire.trainer.batches import BatchConsumer
from rollwire.trainer.settings import BatchSettings, ProductionMix


def scored_log(tmp_path, prefix: str):
    """An embedded log with the catalog's topics under `prefix`, and a producer to fill `scored`."""
    topics = Topics(prefix)
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    return log, topics, EventProducer(log.producer(), topics, name="scorer")


def test_rollouts_that_went_stale_while_pending_are_dropped_not_trained(tmp_path):
    log, topics, producer = scored_log(tmp_path, "b")
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


def test_production_feedback_fills_at_most_its_share_of_a_batch_and_expires_by_age_not_version(tmp_path):
    log, topics, producer = scored_log(tmp_path, "m")
    for i in range(5):  # served by version 0, the trainer is far ahead: still trainable, by age
        producer.send(topics.scored, production(i), key="g")
    producer.send(topics.scored, production(9, served_at_ms=now_ms() - 7_200_000), key="g")  # two hours ago
    for i in range(10, 16):
        producer.send(topics.scored, trainable(i, version=40), key="g")
    producer.flush()
    mix = ProductionMix(share=0.25, max_age_s=3600)
    consumer = BatchConsumer(log, topics, BatchSettings(batch_rollouts=4, max_off_policy=1), vocab_size=82, mix=mix)

    first = consumer.next_batch(policy_version=40)
    assert [s.rollout.rollout_id for s in first.rollouts] == ["f0", "r10", "r11", "r12"]  # one of four: the share
    assert first.staleness.max == 0  # production samples do not count in the version lag
    assert first.drops == {"stale_production": ["f9"]}
    [dropped] = consumer.drops_event(first.drops)
    assert dropped.detail == "served more than 3600 s ago" and dropped.production and dropped.reason == "stale"
    second = consumer.next_batch(policy_version=40)
    assert [s.rollout.rollout_id for s in second.rollouts] == ["f1", "r13", "r14", "r15"]
    # no environment rollouts left: the production samples wait rather than fill a batch
    assert consumer.next_batch(policy_version=40, timeout_s=0.3) is None
    consumer.close()

    alone = BatchConsumer(log, topics, BatchSettings(batch_rollouts=2, max_off_policy=1), vocab_size=82,
                          mix=ProductionMix(share=1.0), name="other")
    assert [s.rollout.rollout_id for s in alone.next_batch(policy_version=40).rollouts] == ["f0", "f1"]
    alone.close()
    producer.close()


def test_a_preference_is_checked_on_both_responses(tmp_path):
    log, topics, producer = scored_log(tmp_path, "p")
    pair = production(0, objective="preference")
    bad = pair.rejected.model_copy(update={"completion_token_ids": [500] * len(pair.rejected.completion_token_ids)})
    producer.send(topics.scored, pair.model_copy(update={"rejected": bad}), key="g")
    producer.send(topics.scored, production(1, objective="preference"), key="g")
    producer.flush()
    consumer = BatchConsumer(log, topics, BatchSettings(batch_rollouts=1), vocab_size=82, mix=ProductionMix(share=1.0))
    batch = consumer.next_batch(policy_version=0)
    assert [s.rollout.rollout_id for s in batch.rollouts] == ["f1"]
    consumer.flush()
    letters = [r for r in log.reader([topics.deadletter], AtOffsets({(topics.deadletter, 0): 0})).poll_batch(10, 2.0)]
    assert len(letters) == 1
    consumer.close()
    producer.close()


def test_production_samples_past_max_pending_are_dropped_oldest_first_and_counted(tmp_path):
    log, topics, producer = scored_log(tmp_path, "o")
    for i in range(6):
        producer.send(topics.scored, production(i), key="g")
    producer.send(topics.scored, trainable(10), key="g")
    producer.flush()
    consumer = BatchConsumer(log, topics, BatchSettings(batch_rollouts=2), vocab_size=82,
                             mix=ProductionMix(share=0.5, max_pending=3))
    batch = consumer.next_batch(policy_version=0)
    assert [s.rollout.rollout_id for s in batch.rollouts] == ["f3", "r10"]  # f0..f2 made room for f3..f5
    assert batch.drops == {"overflow_production": ["f0", "f1", "f2"]}
    [dropped] = consumer.drops_event(batch.drops)
    assert (dropped.reason, dropped.production) == ("overflow", True)
    assert dropped.detail == "more than 3 production samples waited for room in a batch"
    consumer.close()
    producer.close()


def test_a_batch_reports_token_weighted_age_split_rollouts_and_the_lengths_dropping_stale_work_costs(tmp_path):
    from rollwire.schemas import WeightVersionSpan
    log, topics, producer = scored_log(tmp_path, "s")
    long_stale = [trainable(i, version=0, completion=[7] * 20) for i in range(2)]  # 20 tokens, sampled at 0
    split = trainable(2, version=2, completion=[7] * 10)  # tokens 0-3 at version 2, 4-9 at version 3
    spans = [WeightVersionSpan(version=2, start=0, end=4), WeightVersionSpan(version=3, start=4, end=10)]
    split = split.model_copy(update={"rollout": split.rollout.model_copy(update={"weight_versions": spans})})
    fresh = trainable(3, version=3, completion=[7] * 6)
    for scored in (*long_stale, split, fresh):
        producer.send(topics.scored, scored, key="g")
    producer.flush()
    consumer = BatchConsumer(log, topics, BatchSettings(batch_rollouts=2, max_off_policy=1), vocab_size=82)

    batch = consumer.next_batch(policy_version=3)
    staleness = batch.staleness
    assert batch.drops == {"stale": ["r0", "r1"]}
    assert (staleness.min, staleness.mean, staleness.max) == (0, 0.5, 1)  # by each rollout's oldest token
    assert staleness.token_mean == 4 / 16  # 4 of the 16 tokens one version behind, 12 fresh
    assert staleness.split_share == 0.5
    assert staleness.completion_tokens_mean == 8 and staleness.stale_completion_tokens_mean == 20
    consumer.close()
    producer.close()
