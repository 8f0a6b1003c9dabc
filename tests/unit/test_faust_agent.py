"""The faust scoring agent, broker-free through faust's test context (`memory://` store).

This checks the agent's wiring of the scorer; `tests/integration/test_scorer_recovery.py` proves
the same app against a real broker, through a crash."""

from __future__ import annotations

import asyncio

from builders import group_of, tick

from rollwire.core.bus import KafkaBusSettings
from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas import Codec, DeadLetter, RolloutsDropped, ScoredRollout, Topics
from rollwire.streams.faust_app import FaustWorkerSettings, build_app
from rollwire.streams.scoring import ScorerSettings


def run_agent(values: list[tuple[bytes, bytes]], scorer_settings: ScorerSettings) -> list[tuple[str, object]]:
    sent: list[tuple[str, object]] = []

    async def sink(topic, key, value, headers):
        sent.append((topic, Codec().decode(value).event))

    settings = FaustWorkerSettings(app_id="unit-scorer")
    app = build_app(settings, scorer_settings,
                    bus=KafkaBusSettings(bootstrap_servers="127.0.0.1:1"), topics=Topics("unit"), sink=sink)
    app.finalize()
    app.conf.store = "memory://"
    agent = app.agents["rollwire.streams.faust_app.score"]

    async def drive():
        async with agent.test_context() as tested:
            for key, value in values:
                # A tick comes on a timer, after the rollouts it times out: in a later batch.
                await asyncio.sleep(0.01 if key else 2 * settings.batch_wait_s)
                # A tick (no key) goes to partition 0, where the test's groups live too.
                await tested.put(value, key=key, partition=partition_for(key, 4) if key else 0)
            # `put` returns once the agent's batch took the value; let the last batch be handled.
            await asyncio.sleep(4 * settings.batch_wait_s)

    asyncio.run(drive())
    return sent


def test_the_agent_scores_complete_groups_and_dead_letters_bad_records():
    codec = Codec()
    rollouts = group_of("g1", [1, 0, 1, 0]) + group_of("g2", [1, 1])[:1]
    values = [(r.group_id.encode(), codec.encode(r, producer="t")) for r in rollouts]
    values.insert(2, (b"g1", b"\x00 not an event"))
    values.append((b"g1", codec.encode(rollouts[0], producer="t")))  # a redelivery

    sent = run_agent(values, ScorerSettings())

    scored = [e for t, e in sent if isinstance(e, ScoredRollout)]
    assert [e.rollout.rollout_id for e in scored] == ["g1-r0", "g1-r1", "g1-r2", "g1-r3"]
    assert [round(e.advantage, 4) for e in scored] == [1.0, -1.0, 1.0, -1.0]
    assert all(t == "unit.scored" for t, e in sent if isinstance(e, ScoredRollout))
    letters = [e for t, e in sent if isinstance(e, DeadLetter)]
    assert [(letter.error_type, letter.stage, letter.raw) for letter in letters] == [
        ("CorruptEventError", "decode", b"\x00 not an event")]


def test_a_tick_times_out_open_groups_of_its_partition():
    codec = Codec()
    lonely = group_of("g-0", [1, 0, 1])[0]
    elsewhere = group_of("g-z", [1, 0, 1])[0]
    assert partition_for(b"g-0", 4) == 0 and partition_for(b"g-z", 4) != 0
    values = [(b"g-0", codec.encode(lonely, producer="t")),
              (b"g-z", codec.encode(elsewhere, producer="t")),
              (b"", codec.encode(tick(at_ms=0), producer="t"))]

    sent = run_agent(values, ScorerSettings(group_timeout_s=0.001))

    drops = [e for t, e in sent if isinstance(e, RolloutsDropped)]
    assert [(d.reason, d.rollout_ids) for d in drops] == [("group_timeout", ["g-0-r0"])]


def _overflowing_groups() -> list[tuple[bytes, bytes]]:
    """Three groups of 3 on one partition, one rollout each, then the rest of the third."""
    codec = Codec()
    ids = [g for g in (f"o{i}" for i in range(200)) if partition_for(g.encode(), 4) == 0][:3]
    first = [group_of(g, [1, 0, 1])[0] for g in ids]
    rest = group_of(ids[2], [1, 0, 1])[1:]
    return [(r.group_id.encode(), codec.encode(r, producer="t")) for r in first + rest]


def test_past_max_open_groups_the_oldest_open_group_is_dropped_as_overflow():
    sent = run_agent(_overflowing_groups(), ScorerSettings(max_open_groups=2))
    drops = [e for t, e in sent if isinstance(e, RolloutsDropped)]
    assert len(drops) == 1 and drops[0].reason == "overflow" and drops[0].stage == "scorer"
    assert drops[0].rollout_ids == [f"{drops[0].group_id}-r0"]
    assert "max_open_groups 2: the oldest was closed to make room" in drops[0].detail
    scored = [e for t, e in sent if isinstance(e, ScoredRollout)]
    assert len(scored) == 3 and scored[0].rollout.group_id != drops[0].group_id  # the newest group completes


def test_the_embedded_driver_drops_the_same_group_as_overflow(tmp_path):
    from rollwire.core.bus import EmbeddedBusSettings, catalog_topics, open_log
    from rollwire.streams.embedded_scorer import EmbeddedScorer
    from rollwire.streams.scoring import GroupScorer
    topics = Topics("unit")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    with log.producer() as producer:
        for key, value in _overflowing_groups():
            producer.send(topics.rollouts, value, key=key)
    scorer = EmbeddedScorer(log, topics, GroupScorer(ScorerSettings(max_open_groups=2)), group_id="unit")
    while scorer.step(timeout_s=0.5):
        pass
    scorer.close()
    with log.reader([topics.drops, topics.scored]) as reader:
        events = [Codec().decode(r.value).event for _ in range(3) for r in reader.poll_batch(100, 0.3)]
    drops = [e for e in events if isinstance(e, RolloutsDropped)]
    assert [(d.reason, d.rollout_ids) for d in drops] == [("overflow", [f"{drops[0].group_id}-r0"])]
    assert sum(isinstance(e, ScoredRollout) for e in events) == 3 and scorer.stats["overflow"] == 1
    assert scorer.host.open_groups() == 1  # the second group, still waiting for its members
