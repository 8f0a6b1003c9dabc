"""The feedback joiner driven in-process over an event log (`rollwire join`; the embedded default,
Kafka works too).

    reads:  <prefix>.served, <prefix>.feedback   (consumer group `feedback-joiner`)
    writes: <prefix>.scored, <prefix>.drops, <prefix>.deadletter,
            <prefix>.joiner-state  (compacted: a `FeedbackJoinState` per receipt, a `SourceBaseline`
                                    per source under NUL + source; read back on start)

One `step`, as the scorer's commit protocol:

    # Step 1  poll a batch (undecodable records are dead-lettered by the consumer)
    # Step 2  apply each to its receipt's state (`FeedbackJoiner`); queue samples, drops, state
    # Step 3  every `tick_s`, drop feedback that waited past the window, forget old receipts
    # Step 4  send the state changes, coalesced per key; flush: outputs and state are durable
    # Step 5  commit the consumer's offsets

A crash before Step 5 replays the batch: feedback already joined is recognised by its id in the
restored state, so each feedback item becomes one sample or one drop. What the joiner holds lives
in its host (`joiner_host.py`, shared with the faust driver). One process holds every receipt:
served records and feedback are keyed by conversation (or receipt), not co-partitioned by receipt,
so this driver does not split across processes (the faust driver does, by re-keying them); the
messages one receipt sends another about a preference (`PartnerRecord`) are applied at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from rollwire.core.bus import DeadLetters, EventConsumer, EventLog, EventProducer
from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.joiner import FeedbackJoinState, SourceBaseline
from rollwire.schemas.topics import Topics
from rollwire.streams.feedback_join import FeedbackJoiner, joining_span
from rollwire.streams.host import Output
from rollwire.streams.in_process import InProcessDriver
from rollwire.streams.joiner_host import JoinerHost, baseline_partition

logger = logging.getLogger(__name__)


class RestoredReceipts:
    """The receipts and baselines rebuilt from the changelog (`JoinerHost`'s store)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.states: dict[str, FeedbackJoinState] = {}
        self.by_partition: dict[int, dict[str, SourceBaseline]] = {}

    def receipt(self, receipt: str) -> FeedbackJoinState | None:
        return self.states.pop(receipt, None)  # the host holds it from now on

    def receipts(self, partition: int) -> Iterable[str]:
        return [r for r in self.states if partition_for(r.encode(), self.partitions) == partition]

    def baselines(self, partition: int) -> dict[str, SourceBaseline]:
        return self.by_partition.get(partition, {})


class EmbeddedJoiner(InProcessDriver):
    def __init__(self, log: EventLog, topics: Topics, joiner: FeedbackJoiner, *, group_id: str = "feedback-joiner",
                 tick_s: float = 1.0) -> None:
        self.log, self.topics, self.tick_s = log, topics, tick_s
        self.state_topic = topics.name("joiner-state")
        self.producer = EventProducer(log.producer(), topics, name="feedback-joiner")
        self.consumer = EventConsumer(log.consumer([topics.served, topics.feedback], group_id),
                                      DeadLetters(self.producer, "feedback-joiner"), group=group_id)
        self.host = JoinerHost(joiner, topics.spec(topics.name("joiner-in")).partitions)
        self.stats = self.host.stats
        self._next_tick = 0.0
        self._restore()

    def _restore(self) -> None:
        codec, store = Codec(), RestoredReceipts(self.host.partitions)
        for key, record in self.log.latest_per_key(self.state_topic).items():
            if not record.value:
                continue
            try:
                event = codec.decode(record.value).event
            except SchemaError as exc:
                self.consumer.dead_letters.send(record, exc, stage="decode")
                continue
            if isinstance(event, FeedbackJoinState):
                store.states[event.response_id] = event
            elif isinstance(event, SourceBaseline) and (p := baseline_partition(key, store.partitions)) is not None:
                store.by_partition.setdefault(p, {})[event.source] = event
        self.host.reset(store)
        logger.info("feedback joiner restored %d receipts and the baselines of %d sources", len(store.states),
                    len({s for b in store.by_partition.values() for s in b}))

    @property
    def states(self) -> dict[str, FeedbackJoinState]:
        """The receipts held now (after a step: every one restored is read by its first tick)."""
        return self.host.held()

    def step(self, timeout_s: float = 0.5) -> int:
        """One pass of the commit protocol; returns the records read."""
        # Step 1
        deliveries = self.consumer.poll_batch(500, timeout_s)
        # Step 2
        for delivery in deliveries:
            with self.consumer.process_span(delivery):
                outputs = self.host.event(delivery.event)
                if outputs is None:
                    self.consumer.dead_letter(
                        delivery, f"a {delivery.event.type} event does not belong on {delivery.record.topic}")
                else:
                    self._send(outputs)
        # Step 3
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.tick_s
            self._send(self.host.tick())
        # Steps 4 and 5
        self.store_and_commit(self.host.writes())
        return len(deliveries)

    def _send(self, outputs: list[Output]) -> None:
        queue = list(outputs)
        while queue:
            out = queue.pop(0)
            if out.topic == "joiner-in":  # every receipt is held here: a message is applied at once
                queue += self.host.event(out.event) or []
                continue
            with joining_span(out.event, out.made_by if isinstance(out.made_by, FeedbackJoinState) else None):
                self.producer.send(self.topics.name(out.topic), out.event, key=out.key)
