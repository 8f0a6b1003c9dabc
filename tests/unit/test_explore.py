"""The run explorer's index and views, on an embedded log, with no browser: what it keeps of each
event, the pages it serves, the records it reads back, its bounds. (`tests/run/test_demo.py` and
`tests/explore/` drive its page in Chromium over real runs.)"""

from __future__ import annotations

import asyncio

import pytest
from builders import dropped, replica, rollout, scored, serving_decision, trace, train_step, weights

from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.core.http_service import Refused
from rollwire.explore.index import Query, RunIndex
from rollwire.explore.server import Explorer, query_of
from rollwire.schemas import Topics


@pytest.fixture
def run(tmp_path):
    log, topics = open_log(EmbeddedBusSettings(path=tmp_path / "log")), Topics("ex")
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="test")
    for i in range(3):
        r = rollout(rollout_id=f"r{i}", sample_index=i, reward=float(i))
        producer.send(topics.rollouts, r, key=r.group_id)
        producer.send(topics.traces, trace(rollout_id=f"r{i}"), key=r.group_id)
        producer.send(topics.scored, scored(rollout=r, reward=i + 0.2, advantage=i - 1.0), key=r.group_id)
    producer.send(topics.train, train_step(step=4, rollout_ids=["r0", "r1"]), key="policy")
    producer.send(topics.drops, dropped(rollout_ids=["r2"], group_id="group-1"), key="group-1")
    producer.send(topics.fleet, replica(), key="127.0.0.1:8000")
    producer.send(topics.weights, weights(), key="policy")
    producer.send(topics.serving, serving_decision(), key="policy")
    producer.flush()
    yield log, topics, producer
    producer.close()
    log.close()


def _followed(log, topics, **kw) -> RunIndex:
    index = RunIndex(log, topics, **kw)
    while index.follow(timeout_s=0.5):
        pass
    return index


def test_each_rollout_has_its_fate_reward_advantage_and_versions(run):
    log, topics, _ = run
    index = _followed(log, topics)
    total, rows = index.page(Query())
    assert total == 3 and [r["rollout_id"] for r in rows] == ["r2", "r1", "r0"]  # newest first
    by_id = {r["rollout_id"]: r for r in rows}
    assert (by_id["r0"]["fate"], by_id["r0"]["step"], by_id["r0"]["advantage"]) == ("trained", 4, -1.0)
    assert (by_id["r2"]["fate"], by_id["r2"]["reason"]) == ("dropped", "stale")
    assert (by_id["r1"]["version_min"], by_id["r1"]["version_max"]) == (3, 4)
    assert index.page(Query(fate="dropped"))[0] == 1 and index.page(Query(min_reward=1.0))[0] == 2
    assert index.page(Query(version=4))[0] == 3 and index.page(Query(version=5))[0] == 0
    assert index.page(Query(step=4, limit=1))[1][0]["rollout_id"] == "r1"


def test_a_rollouts_story_is_read_back_from_its_records(run):
    log, topics, _ = run
    explorer = Explorer(_followed(log, topics), name="ex")
    story = explorer.rollout("r1")
    assert [t["version"] for t in story["tokens"]] == [3, 3, 3, 3, 4, 4]
    assert [t["text"] for t in story["tokens"]][:2] == ["13 ", "17 "]  # ids, with no tokenizer
    assert story["scored"]["advantage"] == 0.0 and story["row"]["fate"] == "trained"
    assert [t["role"] for t in story["turns"]] == ["user", "assistant"]
    assert [m["rollout_id"] for m in story["group"]] == ["r0", "r1", "r2"]
    with pytest.raises(Refused) as missing:
        explorer.rollout("nope")
    assert missing.value.status == 404


def test_curves_steps_and_fleet(run):
    log, topics, _ = run
    explorer = Explorer(_followed(log, topics), name="ex")
    curves = explorer.curves(0)
    assert [s["step"] for s in curves["steps"]] == [4] and curves["steps"][0]["staleness_max"] == 1
    # per environment, from the rollouts the step trained (r0 and r1: rewards 0 and 1, 0.2 and 1.2 with the group's
    # bonus, which the trainer's step mean counts too)
    assert curves["steps"][0]["environments"] == {"reverse-digits": {"reward": pytest.approx(0.7), "rollouts": 2}}
    assert curves["drops"][-1]["stale"] == 1
    assert curves["reloads"][0]["replica"] == "127.0.0.1:8000" and curves["reloads"][0]["pause_s"] == 0.05
    assert explorer.curves(curves["steps"][0]["time_ms"])["steps"] == []  # only what is new
    step = explorer.step(4)
    assert step["trained_total"] == 2 and step["served"] == {"127.0.0.1:8000": pytest.approx(step["served"]["127.0.0.1:8000"])}
    assert explorer.summary()["finished"] is False  # no recipe: finished is never claimed
    assert Explorer(explorer.index, name="ex", planned_steps=5).summary()["finished"] is False
    assert Explorer(explorer.index, name="ex", planned_steps=4).summary()["finished"] is True
    fleet = explorer.fleet()
    assert fleet["replicas"][0]["serving"] == 4 and fleet["decisions"][0]["canary"] == 4
    assert fleet["versions"][0]["version"] == 4


def test_the_index_says_when_it_caught_up_with_the_log(run):
    log, topics, _ = run
    index = RunIndex(log, topics)
    assert not index.caught_up and index.behind >= 9  # 3 rollouts, their traces and scores at least
    while index.follow(timeout_s=0.5):
        pass
    assert index.caught_up and index.behind == 0
    assert Explorer(index, name="ex").summary()["caught_up"] is True


def test_a_steps_environment_reward_counts_group_rewards_read_after_the_step(tmp_path):
    log, topics = open_log(EmbeddedBusSettings(path=tmp_path / "log")), Topics("late")
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="test")
    r = rollout(rollout_id="r0", reward=1.0)
    producer.send(topics.rollouts, r, key=r.group_id)
    producer.send(topics.train, train_step(step=1, rollout_ids=["r0"]), key="policy")
    producer.flush()
    index = _followed(log, topics)
    assert index.environments_of(1) == {"reverse-digits": {"reward": 1.0, "rollouts": 1}}  # not scored yet: its own
    producer.send(topics.scored, scored(rollout=r, reward=1.2), key=r.group_id)
    producer.flush()
    while index.follow(timeout_s=0.5):
        pass
    assert index.environments_of(1) == {"reverse-digits": {"reward": pytest.approx(1.2), "rollouts": 1}}
    producer.close()
    log.close()


def test_the_index_follows_what_comes_later_and_keeps_the_newest_rollouts_only(run):
    log, topics, producer = run
    index = _followed(log, topics, max_rollouts=4)
    for i in range(3, 6):
        producer.send(topics.rollouts, rollout(rollout_id=f"r{i}", group_id="group-2"), key="group-2")
    producer.flush()
    while index.follow(timeout_s=0.5):
        pass
    assert list(index.rollouts) == ["r2", "r3", "r4", "r5"] and index.forgotten == 2
    assert index.group("group-1") == [index.rollouts["r2"].as_json()]  # forgotten members leave their group


def test_bad_query_values_are_refused_with_what_to_send():
    class Request:
        def __init__(self, **query):
            self.query = query
    assert query_of(Request(fate="dropped", limit="20")).limit == 20
    for bad in ({"limit": "999"}, {"step": "x"}, {"min_reward": "high"}):
        with pytest.raises(Refused) as refused:
            query_of(Request(**bad))
        assert refused.value.status == 400 and next(iter(bad)) in refused.value.reason


def test_the_api_needs_a_bearer_token_when_the_explorer_has_tokens(run):
    from aiohttp.test_utils import TestClient, TestServer

    from rollwire.explore.server import build_app

    log, topics, _ = run
    explorer = Explorer(_followed(log, topics), name="ex", tokens={"s3cret": "me"})  # token -> source

    async def fetch() -> list[int]:
        async with TestClient(TestServer(build_app(explorer))) as client:
            statuses = []
            for path, headers in (("/api/summary", {}), ("/api/summary", {"Authorization": "Bearer wrong"}),
                                  ("/api/summary", {"Authorization": "Bearer s3cret"}), ("/", {})):
                response = await client.get(path, headers=headers)
                statuses.append(response.status)
            return statuses

    # the page itself is public (it holds no data), every /api read is not
    assert asyncio.run(fetch()) == [401, 401, 200, 200]
