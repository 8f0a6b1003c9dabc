"""A run's accounts from its events (`rollwire inspect run`): each dispatched rollout trained,
dropped or in flight, and each broken promise named."""

from __future__ import annotations

import builders as b

from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.run.ledger import render_ledger, run_ledger
from rollwire.schemas.topics import Topics


def _ledger(tmp_path, events):
    topics = Topics("led")
    with open_log(EmbeddedBusSettings(path=tmp_path / "log")) as log:
        log.create_topics(catalog_topics(topics))
        producer = EventProducer(log.producer(), topics, name="test")
        for i, (topic, event) in enumerate(events):
            producer.send(topics.name(topic), event, key=f"{topic}-{i}")
        producer.flush()
        return run_ledger(log, topics)


def _run_events(*, copy_trained: bool = False, step_again: bool = False, versions=(1, 2), replica_on: int = 2):
    g1 = [b.rollout(rollout_id=f"a{i}", group_id="g1", sample_index=i, group_size=2) for i in range(2)]
    g2 = [b.rollout(rollout_id=f"b{i}", group_id="g2", sample_index=i, group_size=2) for i in range(2)]
    copy = b.rollout(rollout_id="a0-again", group_id="g1", sample_index=0, group_size=2)  # the task run twice
    events = [("tasks", b.task(group_id="g1", group_size=2)), ("tasks", b.task(group_id="g2", group_size=2)),
              ("tasks", b.task(group_id="g3", group_size=2)),  # never recorded
              *[("rollouts", r) for r in [*g1, copy, *g2]],
              *[("scored", b.scored(rollout=r)) for r in g1],
              ("scored", b.scored(rollout=g2[0])),
              ("drops", b.dropped(rollout_ids=["a0-again"], group_id="g1", reason="duplicate", stage="scorer")),
              ("drops", b.dropped(rollout_ids=["b1"], group_id="g2", reason="stale", stage="trainer")),
              ("train", b.train_step(step=1, rollout_ids=["a0", "a1"] + (["a0-again"] if copy_trained else []))),
              ("train", b.train_step(step=2 if not step_again else 1, rollout_ids=[]))]
    events += [("weights", b.weights(version=v, step=v)) for v in versions]
    events += [("fleet", b.replica(replica_id="replica-0", state="serving", serving_version=replica_on))]
    return events


def test_every_dispatched_rollout_is_trained_dropped_or_in_flight_and_the_promises_hold(tmp_path):
    ledger = _ledger(tmp_path, _run_events())
    assert ledger.dispatched == 6 and ledger.trained == 2
    assert dict(ledger.dropped) == {"stale": 1}  # g1's copy was dropped, but its slot was trained
    assert dict(ledger.in_flight) == {"not recorded": 2, "scored, not trained": 1}
    assert ledger.recorded_again == 1 and ledger.accounted and ledger.problems() == []
    text = render_ledger(ledger)
    assert "dispatched rollouts  6" in text and "promises kept        all" in text
    assert "replica              replica-0 last served version 2" in text


def test_each_broken_promise_is_named(tmp_path):
    ledger = _ledger(tmp_path, _run_events(copy_trained=True, step_again=True, versions=(1, 3, 2), replica_on=1))
    problems = "\n".join(ledger.problems())
    assert "1 dispatched rollouts trained more than once, e.g. group g1 sample 0" in problems
    assert "step numbers repeated: [1]" in problems
    assert "policy's published versions do not strictly increase: [1, 3, 2]" in problems
    assert "replicas not on the newest version 3: replica-0 on 1" in problems
    assert "promises kept        NO" in render_ledger(ledger)
