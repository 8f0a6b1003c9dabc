"""Each stream processor's two drivers, fed the same records, send the same events.

The scorer and the feedback joiner each have an in-process driver (any event log) and a faust
driver (Kafka). Both only feed the processor's host (`streams/scorer_host.py`,
`streams/joiner_host.py`) and persist what it returns, so the same input must come out the same:
scored samples with their advantages, drops with their reasons (overflow, timeouts, joins that
fail), dead letters. The in-process driver runs on the embedded log; the faust agent runs in
faust's test context (no broker), one record at a time in the same order, ticks included.
`tests/integration/test_scorer_recovery.py` and `test_feedback_joiner.py` run both drivers against
a real broker through a crash."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import faust
import pytest
from builders import group_of
from builders import served as served_at

from rollwire.core.bus import EmbeddedBusSettings, KafkaBusSettings, catalog_topics, open_log
from rollwire.core.bus.base import Beginning
from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas import Codec, DeadLetter, FeedbackReceived, RolloutsDropped, ScoredRollout, ScorerTick, Topics
from rollwire.schemas.base import Event, now_ms
from rollwire.streams.embedded_joiner import EmbeddedJoiner
from rollwire.streams.embedded_scorer import EmbeddedScorer
from rollwire.streams.faust_app import FaustWorkerSettings, Sink
from rollwire.streams.feedback_join import FeedbackJoiner, FeedbackJoinSettings
from rollwire.streams.scoring import GroupScorer, ScorerSettings

codec = Codec()
NO_BROKER = KafkaBusSettings(bootstrap_servers="127.0.0.1:1")
"""Faust's test context sends nothing to a broker: the agents' outputs go to a sink."""
TICK = "tick"
"""An input that stands for the timer: every partition's tick (faust), the driver's tick (in process)."""
SLEEP = "sleep"
"""An input that waits out the scorer's group timeout."""
GROUP_TIMEOUT_S = 1.0


def summary(topic: str, event: Event) -> tuple:
    """What must match between drivers: where each event went and what it says."""
    short = topic.split(".", 1)[1]
    if isinstance(event, ScoredRollout):
        return short, "scored", event.rollout.rollout_id, round(event.reward, 6), round(event.advantage or 0.0, 6), \
            event.objective, event.rejected.rollout_id if event.rejected else None
    if isinstance(event, RolloutsDropped):
        return short, "dropped", event.reason, tuple(event.rollout_ids), event.group_id
    assert isinstance(event, DeadLetter)
    return short, "dead letter", event.stage, event.error_type, event.key  # faust's test topic is "<internal>"


# -- the in-process driver, on the embedded log ---------------------------------------------------

def run_in_process(tmp_path, topics: Topics, make: Callable, inputs: list) -> list[tuple]:
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    driver = make(log, topics)
    driver.tick_s = 3600.0  # the first step's tick finds nothing due; the others come when the input says
    with log.producer() as producer:
        for item in inputs:
            if item == SLEEP:
                time.sleep(GROUP_TIMEOUT_S + 0.2)
                continue
            if item == TICK:
                driver._next_tick = 0.0
                driver.step(timeout_s=0.1)
                continue
            topic, key, value = item
            producer.send(topic, value, key=key)
            producer.flush()
            # one record at a time, the faust agent's order (a record that does not decode is
            # dead-lettered by the consumer: no step counts it, it is read within the wait)
            deadline = time.monotonic() + 2
            while not driver.step(timeout_s=0.2) and time.monotonic() < deadline:
                pass
    driver.close()
    out_topics = [topics.scored, topics.drops, topics.deadletter]
    with log.reader(out_topics, Beginning()) as reader:
        records = []
        while batch := reader.poll_batch(1000, 0.5):
            records += batch
    log.close()
    return sorted(summary(r.topic, codec.decode(r.value).event) for r in records)


# -- the faust driver, in faust's test context -------------------------------------------------

def run_faust(build: Callable[[Sink], faust.App], agent_name: str, inputs: list, partitions: int,
              loop_back: str | None = None) -> list[tuple]:
    """Puts each input on the agent's stream, one at a time, on its key's partition; records sent to
    `loop_back` (the joiner's messages between receipts) are put back before the next input, as
    Kafka would deliver them."""
    sent: list[tuple[str, bytes | None, bytes]] = []

    async def sink(topic, key, value, headers):
        sent.append((topic, key, value))

    app = build(sink)
    app.finalize()
    app.conf.store = "memory://"
    agent = app.agents[agent_name]
    settings = FaustWorkerSettings()

    async def settle() -> None:
        await asyncio.sleep(4 * settings.batch_wait_s)

    async def drive() -> None:
        async with agent.test_context() as tested:
            for item in inputs:
                if item == SLEEP:
                    await asyncio.sleep(GROUP_TIMEOUT_S + 0.2)
                    continue
                if item == TICK:
                    for p in range(partitions):
                        await tested.put(codec.encode(ScorerTick(), producer="t"), key=None, partition=p)
                    await settle()
                    continue
                _, key, value = item
                await tested.put(value, key=key, partition=partition_for(key, partitions))
                await settle()
                while loop_back and (messages := [s for s in sent if s[0] == loop_back]):
                    for message in messages:
                        sent.remove(message)
                        await tested.put(message[2], key=message[1], partition=partition_for(message[1], partitions))
                        await settle()

    asyncio.run(drive())
    return sorted(summary(topic, codec.decode(value).event) for topic, _, value in sent)


# -- the scorer ---------------------------------------------------------------------------------

def scorer_inputs(topics: Topics) -> list:
    """A complete group with a redelivery; a record that does not decode; a rollout of a group too
    large to hold; three groups past `max_open_groups` 2 (the oldest closed early); and two groups
    left open past their timeout."""
    complete = group_of("g1", [1, 0, 1, 0])
    opened = [group_of(g, [1, 0, 1]) for g in ("o1", "o2", "o3")]
    lonely = group_of("lonely", [1, 0, 1])[0]
    huge = group_of("huge", [1.0] * 5)[0]
    rollouts = [*complete, complete[0], *(g[0] for g in opened), *opened[2][1:], huge, lonely]
    records = [(topics.rollouts, r.group_id.encode(), codec.encode(r, producer="t")) for r in rollouts]
    records.insert(5, (topics.rollouts, b"g1", b"\x00 not an event"))
    return [*records, SLEEP, TICK]


def test_the_scorers_two_drivers_send_the_same_events(tmp_path):
    from rollwire.streams.faust_app import build_app
    topics = Topics("contract")
    settings = ScorerSettings(max_open_groups=2, max_group_size=4, group_timeout_s=GROUP_TIMEOUT_S)
    inputs = scorer_inputs(topics)

    embedded = run_in_process(tmp_path, topics, lambda log, t: EmbeddedScorer(
        log, t, GroupScorer(settings), group_id="contract"), inputs)
    by_faust = run_faust(lambda sink: build_app(FaustWorkerSettings(app_id="contract-scorer"), settings, bus=NO_BROKER,
                                                topics=topics, sink=sink),
                         "rollwire.streams.faust_app.score", inputs, topics.spec(topics.rollouts).partitions)

    assert by_faust == embedded
    # ... and they say what they should, so two drivers broken alike fail too
    scored = {s[2]: s[3] for s in embedded if s[1] == "scored"}
    assert scored == {"g1-r0": 1.0, "g1-r1": 0.0, "g1-r2": 1.0, "g1-r3": 0.0, "o3-r0": 1.0, "o3-r1": 0.0, "o3-r2": 1.0}
    drops = {s[2:4] for s in embedded if s[1] == "dropped"}
    assert drops == {("overflow", ("o1-r0",)), ("group_timeout", ("o2-r0",)), ("group_timeout", ("lonely-r0",))}
    assert sorted(s[2] for s in embedded if s[1] == "dead letter") == ["decode", "process"]


# -- the feedback joiner ---------------------------------------------------------------------------

def rating(feedback_id: str, value: float, receipt: str | None, source: str = "app-a") -> FeedbackReceived:
    """A rating of receipt `receipt`; None: of a response served elsewhere (its messages only)."""
    about = {"response_id": receipt} if receipt else {"messages": [{"role": "user", "content": "hi"}]}
    return FeedbackReceived(feedback_id=feedback_id, kind="rating", rating=value, source=source, **about)


def preference(feedback_id: str, first: str, second: str) -> FeedbackReceived:
    return FeedbackReceived(feedback_id=feedback_id, kind="preference", response_ids=[first, second],
                            preferred_index=1, source="app-a")


def joiner_inputs(topics: Topics) -> list:
    """Ratings after and before their responses, from two sources (baselines per partition); a
    resend; a preference whose second response comes later (messages between receipts); feedback
    naming no response; an event that does not belong; a record that does not decode."""
    def served(**kw):  # served now: the in-process driver's first tick must not forget it
        return served_at(served_at_ms=now_ms(), **kw)

    events: list[tuple[str, Event]] = [
        (topics.served, served(response_id="resp-a")),
        (topics.feedback, rating("fb-1", 1.0, "resp-a")),
        (topics.feedback, rating("fb-2", 0.0, "resp-a")),
        (topics.feedback, rating("fb-3", 0.5, "resp-b", source="app-b")),
        (topics.served, served(response_id="resp-b")),
        (topics.feedback, rating("fb-1", -1.0, "resp-a")),  # a resend
        (topics.feedback, rating("fb-4", -1.0, "resp-b")),
        (topics.feedback, preference("fb-p", "resp-a", "resp-c")),
        (topics.served, served(response_id="resp-c", completion="abc")),
        (topics.feedback, rating("fb-x", 1.0, None)),
        (topics.served, group_of("wrong", [1.0, 0.0])[0]),
    ]
    records: list = [(topic, _receipt_key(e), codec.encode(e, producer="t")) for topic, e in events]
    records.append((topics.feedback, b"resp-a", b"\x00 not an event"))
    return records


def _receipt_key(event: Event) -> bytes:
    receipt = getattr(event, "response_id", None) or (getattr(event, "response_ids", None) or [None])[0]
    return (receipt or getattr(event, "feedback_id", None) or "x").encode()


@pytest.mark.parametrize("baseline", ["source_mean", "none"])
def test_the_joiners_two_drivers_send_the_same_events(tmp_path, baseline):
    topics = Topics("contract")
    settings = FeedbackJoinSettings(baseline=baseline)
    inputs = joiner_inputs(topics)
    embedded = run_in_process(tmp_path, topics, lambda log, t: EmbeddedJoiner(
        log, t, FeedbackJoiner(settings), group_id="contract"), inputs)

    from rollwire.streams.faust_joiner import build_app
    joiner_in = topics.name("joiner-in")
    # the joining agent, fed as the routing agent feeds it: each record keyed by its receipt
    by_faust = run_faust(lambda sink: build_app(FaustWorkerSettings(app_id="contract-joiner"), FeedbackJoiner(settings),
                                                bus=NO_BROKER, topics=topics, sink=sink),
                         "rollwire.streams.faust_joiner.join", inputs, topics.spec(joiner_in).partitions,
                         loop_back=joiner_in)

    assert by_faust == embedded
    samples = {s[2]: s[3:5] for s in embedded if s[1] == "scored"}
    # resp-a and resp-b are on different partitions: app-a's baseline at resp-b counts fb-4 alone
    assert partition_for(b"resp-a", 4) != partition_for(b"resp-b", 4)
    if baseline == "source_mean":
        assert samples["fb-4"] == (-1.0, -1.0) and samples["fb-2"] == (0.0, -1.0)
    assert set(samples) == {"fb-1", "fb-2", "fb-3", "fb-4", "fb-p"}
    if baseline == "none":
        assert samples["fb-2"] == (0.0, 0.0) and samples["fb-4"] == (-1.0, -1.0)
    drops = [s[2:4] for s in embedded if s[1] == "dropped"]
    assert drops == [("unjoinable", ("fb-x",))]
    assert sorted(s[2] for s in embedded if s[1] == "dead letter") == ["decode", "process"]
