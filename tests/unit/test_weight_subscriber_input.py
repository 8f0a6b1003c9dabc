"""A weight subscriber that meets a record it cannot use (bytes that are no event, an event of
another type) dead-letters it with the reason and keeps following the topic; the engine is never
touched. (No inference server: none is reached.)"""

from __future__ import annotations

from rollwire.consumers.vllm_control import SwapTimes
from rollwire.consumers.weight_subscriber import WeightSubscriber, WeightSubscriberSettings
from rollwire.core.bus import DeadLetters, EmbeddedBusSettings, EventProducer, catalog_topics, open_log, read_to_end
from rollwire.core.objectstore import LocalStore
from rollwire.schemas import DeadLetter, Topics
from rollwire.schemas.weights import ReplicaStatus


class Untouchable:
    """A vLLM control client that fails the test if the subscriber calls it."""

    def __getattr__(self, name):
        raise AssertionError(f"the engine was touched ({name})")


def test_garbage_on_the_weights_topic_is_dead_lettered_and_the_subscriber_goes_on(tmp_path):
    topics = Topics("w")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    raw = log.producer()
    raw.send(topics.weights, b"\x00garbage", key=b"policy")  # the latest record at start: caught up on
    raw.flush()
    subscriber = WeightSubscriber(log, topics, LocalStore(tmp_path / "store"), Untouchable(),
                                  WeightSubscriberSettings(replica_id="r0", cache_dir=tmp_path / "cache"))
    assert subscriber.catch_up() is None
    raw.send(topics.weights, b"more garbage", key=b"policy")
    raw.flush()
    others = EventProducer(log.producer(), topics, name="confused")
    others._producer.send(topics.weights, others.codec.encode(ReplicaStatus(replica_id="x", state="serving"),
                                                              producer="confused", event_id="e1"), key=b"policy")
    others.flush()
    assert subscriber.poll(timeout_s=2.0) == [] and subscriber.serving is None
    subscriber.close()
    letters = [d.event for d in read_to_end(log, [topics.deadletter], DeadLetters(others, "test"))]
    assert [(letter.component, letter.stage) for letter in letters] == [
        ("replica/r0", "decode"), ("replica/r0", "decode"), ("replica/r0", "process")]
    assert all(isinstance(letter, DeadLetter) and letter.source_topic == topics.weights for letter in letters)
    assert "replica.status event on w.weights, where this replica expects weights.published" in letters[2].error


class FlakyEngine:
    """A vLLM control client whose server can be down: swaps then fail as a dead server's would."""

    def __init__(self) -> None:
        self.down = False
        self.swapped: list[int] = []

    def swap_full_weights(self, weights_dir: str, version_label: str, *, stage: bool = True) -> SwapTimes:
        from rollwire.consumers.vllm_control import VllmError
        if self.down:
            raise VllmError("POST /pause failed: connection refused")
        self.swapped.append(int(version_label))
        return SwapTimes(drain_s=0.001, apply_s=0.008, paused_s=0.01)


def test_a_restarted_server_gets_the_newest_version_whose_swap_failed_while_it_was_down(tmp_path):
    """The chaos run's stall: vLLM killed in the middle of swaps, the versions published meanwhile
    refused (the served one kept), the server restarted with the served version; nothing publishes
    those versions again, so the replica must reach the newest itself, or the dispatcher waits on it
    for good."""
    import numpy
    from safetensors.numpy import save_file

    from rollwire.core.weight_versions import publish, version_prefix
    from rollwire.schemas.weights import WeightsPublished
    topics, store = Topics("w"), LocalStore(tmp_path / "store")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    trainer = EventProducer(log.producer(), topics, name="trainer")

    def publish_version(version: int) -> None:
        folder = tmp_path / f"model-{version}"
        folder.mkdir()
        save_file({"w": numpy.full((2, 2), version, dtype=numpy.float32)}, str(folder / "model.safetensors"))
        done = publish(store, folder, version_prefix("policy", version), policy="policy", version=version, step=version)
        trainer.send(topics.weights, WeightsPublished(policy="policy", version=version, step=version, uri=done.uri,
                                                      manifest_sha256=done.manifest_sha256,
                                                      size_bytes=done.size_bytes), key="policy")
        trainer.flush()

    engine = FlakyEngine()
    subscriber = WeightSubscriber(log, topics, store, engine,
                                  WeightSubscriberSettings(replica_id="r0", cache_dir=tmp_path / "cache"))
    publish_version(1)
    assert subscriber.catch_up().serving_version == 1
    engine.down = True
    publish_version(2)
    publish_version(3)
    assert [s.state for s in subscriber.poll(timeout_s=2.0)] == ["failed", "failed"]
    assert subscriber.serving.version == 1
    engine.down = False  # the replica restarted the server

    status = subscriber.reapply()

    assert engine.swapped == [1, 1, 3] and subscriber.serving.version == 3
    assert status.state == "serving" and status.serving_version == 3
    subscriber.close()
    trainer.close()
