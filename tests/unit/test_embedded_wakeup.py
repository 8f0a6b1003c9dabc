"""An embedded-log consumer is woken by appends to its own topics (inotify on Linux), not by a timer."""

from __future__ import annotations

import threading
import time

from rollwire.core.bus import TopicConfig
from rollwire.core.bus.embedded import EmbeddedLog
from rollwire.core.bus.embedded_wakeup import TopicWatch


def append_later(log: EmbeddedLog, topic: str, delay_s: float) -> threading.Thread:
    def append() -> None:
        time.sleep(delay_s)
        with log.producer() as producer:
            producer.send(topic, b"x", key=b"k")
    thread = threading.Thread(target=append)
    thread.start()
    return thread


def test_an_append_to_a_watched_topic_wakes_the_waiter_and_others_do_not(tmp_path):
    log = EmbeddedLog(tmp_path / "log")
    log.create_topics([TopicConfig("mine"), TopicConfig("other")])
    watch = TopicWatch(log.root / "topics", ["mine"])
    assert watch.event_driven, "no inotify: rollwire's machines and CI are Linux, where a consumer must not poll"

    writer = append_later(log, "other", 0.1)
    started = time.monotonic()
    watch.wait(1.0)
    assert time.monotonic() - started >= 0.9, "an append to another topic woke the waiter"
    writer.join()

    writer = append_later(log, "mine", 0.2)
    started = time.monotonic()
    watch.wait(30.0)
    assert time.monotonic() - started < 10.0
    writer.join()
    watch.close()


def test_without_inotify_the_waiter_falls_back_to_short_sleeps(tmp_path, monkeypatch):
    monkeypatch.setattr("rollwire.core.bus.embedded_wakeup._inotify", lambda folder: None)
    watch = TopicWatch(tmp_path, ["mine"])
    assert not watch.event_driven
    started = time.monotonic()
    for _ in range(10):
        watch.wait(5.0)
    assert time.monotonic() - started < 1.0  # 1 ms doubling to at most 20 ms per wait, never the timeout
