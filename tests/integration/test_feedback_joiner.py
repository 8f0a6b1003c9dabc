"""`rollwire join` on the embedded log and a real Kafka broker: feedback and served responses in
either order, the joiner `kill -9`ed while feedback waits for its response, restarted. Every
rating becomes one sample of its served tokens, a preference one pair once both its responses
are in, late feedback one drop; nothing is lost, and a
sample repeated by at-least-once delivery carries the same id (the trainer keeps one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest
from builders import served

from rollwire.core.bus import Beginning, EventProducer, catalog_topics
from rollwire.schemas import Codec, FeedbackReceived, RolloutsDropped, ScoredRollout, Topics


def start_joiner(bus_settings, prefix: str, config, driver: str, tmp_path, *extra: str) -> subprocess.Popen:
    if bus_settings.type == "kafka":
        bus = ["--bus", "kafka", "--bootstrap", bus_settings.bootstrap_servers]
    else:
        bus = ["--log-dir", str(bus_settings.path)]
    return subprocess.Popen([sys.executable, "-m", "rollwire", "join", "--prefix", prefix, "--config", str(config),
                             "--driver", driver, "--app-id", f"{prefix}-joiner", *bus, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)


def outputs(log, topics: Topics) -> list:
    out = []
    for topic in (topics.scored, topics.drops):
        with log.reader([topic], Beginning()) as reader:
            while batch := reader.poll_batch(1000, 1.0):
                out += [Codec().decode(r.value).event for r in batch]
    return out


def rating(i: int, receipt: str, *, at: int | None = None) -> FeedbackReceived:
    return FeedbackReceived(feedback_id=f"fb-{i}", kind="rating", rating=(i % 3 - 1) / 1.0, response_id=receipt,
                            source="chat-app", **({"received_at_ms": at} if at is not None else {}))


@pytest.mark.slow
def test_a_killed_joiner_restarts_and_turns_every_rating_into_one_sample(bus_settings, log, tmp_path):
    killed_and_restarted(bus_settings, log, tmp_path, "embedded")


@pytest.mark.slow
@pytest.mark.kafka
def test_the_faust_joiner_killed_and_restarted_turns_every_rating_into_one_sample(kafka_bootstrap, tmp_path):
    from rollwire.core.bus import KafkaBusSettings, open_log
    settings = KafkaBusSettings(bootstrap_servers=kafka_bootstrap)
    with open_log(settings) as log:
        killed_and_restarted(settings, log, tmp_path, "faust")


def killed_and_restarted(bus_settings, log, tmp_path, driver: str) -> None:
    topics = Topics(f"t{uuid.uuid4().hex[:10]}")
    log.create_topics(catalog_topics(topics))
    config = tmp_path / "joiner.toml"
    config.write_text("[joiner]\nwindow_s = 30\nbaseline = \"none\"\n")
    producer = EventProducer(log.producer(), topics, name="test")
    receipts = [f"resp-{i}" for i in range(6)]
    # Phase 1: served records for the first three receipts; ratings for all six (the last three wait).
    for receipt in receipts[:3]:
        record = served(response_id=receipt, conversation_id=None, served_at_ms=int(time.time() * 1000))
        producer.send(topics.served, record, key=record.key)
    for i, receipt in enumerate(receipts):
        producer.send(topics.feedback, rating(i, receipt), key=receipt)
    producer.send(topics.feedback, rating(99, "resp-never", at=int(time.time() * 1000) - 60_000), key="resp-never")
    # a preference between a served response and one that comes only after the kill
    preference = FeedbackReceived(feedback_id="fb-p", kind="preference", response_ids=["resp-0", "resp-4"],
                                  preferred_index=1, source="chat-app")
    producer.send(topics.feedback, preference, key=preference.key)
    producer.flush()

    joiner = start_joiner(bus_settings, topics.prefix, config, driver, tmp_path)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len([e for e in outputs(log, topics) if isinstance(e, ScoredRollout)]) < 3:
            time.sleep(0.5)
        time.sleep(1.5)  # past a commit, with three ratings still waiting for their responses
    finally:
        os.kill(joiner.pid, signal.SIGKILL)
        joiner.wait()

    # Phase 2, while it is down: the missing responses, and a resend of a joined rating.
    for receipt in receipts[3:]:
        record = served(response_id=receipt, conversation_id=None)
        producer.send(topics.served, record, key=record.key)
    producer.send(topics.feedback, rating(0, "resp-0"), key="resp-0")
    producer.close()

    if driver == "embedded":  # idle for longer than the killed member's session (10 s), whose partitions move only then
        again = start_joiner(bus_settings, topics.prefix, config, driver, tmp_path, "--exit-when-idle", "15")
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err[-3000:]
    else:  # a faust worker serves until stopped: until every sample is out, and a little longer
        again = start_joiner(bus_settings, topics.prefix, config, driver, tmp_path)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and len({e.rollout.rollout_id for e in outputs(log, topics)
                                                    if isinstance(e, ScoredRollout)}) < 7:
            assert again.poll() is None, again.communicate()[1][-3000:]
            time.sleep(1.0)
        time.sleep(3.0)
        again.send_signal(signal.SIGTERM)
        out, err = again.communicate(timeout=60)

    events = outputs(log, topics)
    samples = [e for e in events if isinstance(e, ScoredRollout)]
    drops = [e for e in events if isinstance(e, RolloutsDropped)]
    assert {s.rollout.rollout_id for s in samples} == {f"fb-{i}" for i in range(6)} | {"fb-p"}, (out, err[-2000:])
    repeated = sum(n - 1 for n in Counter(s.rollout.rollout_id for s in samples).values())
    assert repeated <= 3, "at-least-once may repeat a batch, never multiply the stream"
    assert [(d.rollout_ids, d.reason) for d in drops] == [(["fb-99"], "unjoinable")]
    by_id = {s.rollout.rollout_id: s for s in samples}
    assert by_id["fb-4"].rollout.completion_token_ids == served().call.completion_token_ids
    assert by_id["fb-4"].reward == (4 % 3 - 1) and by_id["fb-4"].advantage == by_id["fb-4"].reward  # baseline none
    pair = by_id["fb-p"]  # waited at resp-0 through the kill; completed when resp-4's record came
    assert pair.objective == "preference" and pair.production.response_ids == ["resp-0", "resp-4"]
    assert (pair.rollout.task_id, pair.rejected.task_id) == ("resp-4", "resp-0")
