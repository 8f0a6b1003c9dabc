"""What the stream processors driven in-process share (`embedded_scorer.py`, `embedded_joiner.py`):
the end of their commit protocol (state changes sent, flushed, then offsets committed), stepping
it until interrupted or idle, and closing their consumer and producer."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from rollwire.core.bus import EventConsumer, EventProducer
from rollwire.schemas.base import Event


class InProcessDriver:
    """A driver whose `step` runs one pass of its commit protocol and returns the records it read."""

    consumer: EventConsumer
    producer: EventProducer
    state_topic: str
    """The compacted topic the driver keeps its state on."""

    def step(self, timeout_s: float = 0.5) -> int:
        raise NotImplementedError

    def store_and_commit(self, writes: Iterable[tuple[str, Event | None]],
                         partition_of: Callable[[str], int | None] = lambda key: None) -> None:
        """The protocol's last two steps: the state changes (None: a tombstone) sent to
        `state_topic`, on the partition `partition_of(key)` gives (None: the key's own), then a
        flush, so outputs and state are durable, and only then the consumer's offsets committed."""
        for key, record in writes:
            if record is None:
                self.producer.send_tombstone(self.state_topic, key=key, partition=partition_of(key))
            else:
                self.producer.send(self.state_topic, record, key=key, partition=partition_of(key))
        self.producer.flush()
        self.consumer.commit()

    def run(self, stop_after_idle_s: float | None = None) -> None:
        """Steps until interrupted, or until nothing arrived for `stop_after_idle_s`."""
        idle_since = time.monotonic()
        while True:
            if self.step():
                idle_since = time.monotonic()
            elif stop_after_idle_s is not None and time.monotonic() - idle_since > stop_after_idle_s:
                return

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()
