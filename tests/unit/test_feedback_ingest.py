"""The ingestion core's own paths, over a stand-in log: what it answers when too much waits for the
log (429) and when the log fails (503), and that one id sent twice at once is written once.
(tests/integration/test_feedback_api.py runs the server against the real logs.)"""

from __future__ import annotations

import asyncio
import threading

import pytest

from rollwire.core.bus.errors import DeliveryError
from rollwire.core.errors import ConfigError
from rollwire.core.http_service import Refused, load_tokens
from rollwire.producers.feedback_api import FeedbackApiSettings, Ingest, to_event
from rollwire.schemas import Topics


class StandInProducer:
    def __init__(self, release: threading.Event, fail: bool = False) -> None:
        self.release, self.fail, self.sent = release, fail, []

    def send(self, topic, value, *, key=None, headers=(), timestamp_ms=None, partition=None):
        self.sent.append(key)

    def flush(self, timeout_s=30.0):
        self.release.wait(5)
        if self.fail:
            raise DeliveryError("1 record(s) were not delivered: broker down", [("t", None, "broker down")])

    def close(self):
        pass


class StandInLog:
    def __init__(self, producer) -> None:
        self._producer = producer

    def producer(self):
        return self._producer


def event(feedback_id: str):
    return to_event({"feedback_id": feedback_id, "kind": "rating", "rating": 1, "response_id": "r"}, "app")


def test_past_max_pending_requests_get_429_and_the_waiting_ones_are_stored():
    release = threading.Event()
    producer = StandInProducer(release)
    ingest = Ingest(StandInLog(producer), Topics("u"), FeedbackApiSettings(max_pending=2))

    async def scenario():
        await ingest.start()
        waiting = [asyncio.create_task(ingest.submit(event(f"f{i}"))) for i in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(Refused) as refused:
            await ingest.submit(event("f9"))
        release.set()
        results = await asyncio.gather(*waiting)
        await ingest.close()
        return refused.value, results

    refused, results = asyncio.run(scenario())
    assert refused.status == 429 and refused.headers == {"Retry-After": "1"}
    assert [r["status"] for r in results] == ["stored", "stored"] and producer.sent == [b"r", b"r"]


def test_a_log_that_fails_gets_503_and_the_id_can_be_sent_again():
    release = threading.Event()
    release.set()
    producer = StandInProducer(release, fail=True)
    ingest = Ingest(StandInLog(producer), Topics("u"), FeedbackApiSettings())

    async def scenario():
        await ingest.start()
        with pytest.raises(Refused) as refused:
            await ingest.submit(event("f1"))
        producer.fail = False
        retried = await ingest.submit(event("f1"))
        twice = await asyncio.gather(ingest.submit(event("f2")), ingest.submit(event("f2")))
        await ingest.close()
        return refused.value, retried, twice

    refused, retried, twice = asyncio.run(scenario())
    assert refused.status == 503 and "broker down" in refused.reason and refused.headers["Retry-After"] == "2"
    assert retried["status"] == "stored"
    assert sorted(r["status"] for r in twice) == ["duplicate", "stored"] and len(producer.sent) == 3


def test_tokens_come_from_a_file_and_the_environment_and_must_be_long(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# source token\nchat-app " + "t" * 20 + "\n\n")
    assert load_tokens(path, "ROLLWIRE_FEEDBACK_TOKENS", {"ROLLWIRE_FEEDBACK_TOKENS": "search=" + "s" * 16}) == {
        "t" * 20: "chat-app",
                                                                                     "s" * 16: "search"}
    with pytest.raises(ConfigError, match="shorter than 16 characters"):
        load_tokens(None, "ROLLWIRE_FEEDBACK_TOKENS", {"ROLLWIRE_FEEDBACK_TOKENS": "app=short"})
    path.write_text("only-one-word\n")
    with pytest.raises(ConfigError, match=r"tokens:1: expected `SOURCE TOKEN`"):
        load_tokens(path, "ROLLWIRE_FEEDBACK_TOKENS", {})
