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
restored state, so each feedback item becomes one sample or one drop. The messages one receipt
sends another about a preference (`PartnerRecord`) are applied at once: this driver holds every
receipt. One process holds every
receipt: served records and feedback are keyed by conversation (or receipt), not co-partitioned
by receipt, so the joiner does not split across processes yet.
"""

from __future__ import annotations

import collections
import heapq
import logging
import time

from rollwire.core.bus import DeadLetters, EventConsumer, EventLog, EventProducer
from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, SourceBaseline
from rollwire.schemas.rollout import ScoredRollout
from rollwire.schemas.serving import ResponseServed
from rollwire.schemas.topics import Topics
from rollwire.streams.feedback_join import FeedbackJoiner, JoinStep, joining_span, receipt_of
from rollwire.streams.group_changelog import PendingWrites
from rollwire.streams.in_process import InProcessDriver

logger = logging.getLogger(__name__)

BASELINE_KEY = "\x00"
"""Before a source's name in its baseline's changelog key (receipts never start with NUL)."""


class EmbeddedJoiner(InProcessDriver):
    def __init__(self, log: EventLog, topics: Topics, joiner: FeedbackJoiner, *, group_id: str = "feedback-joiner",
                 tick_s: float = 1.0) -> None:
        self.log, self.topics, self.joiner, self.tick_s = log, topics, joiner, tick_s
        self.state_topic = topics.name("joiner-state")
        self.producer = EventProducer(log.producer(), topics, name="feedback-joiner")
        self.consumer = EventConsumer(log.consumer([topics.served, topics.feedback], group_id),
                                      DeadLetters(self.producer, "feedback-joiner"), group=group_id)
        self.states: dict[str, FeedbackJoinState] = {}
        self.baselines: dict[str, SourceBaseline] = {}
        self.pending = PendingWrites()
        self.stats: collections.Counter[str] = collections.Counter()
        self._due: list[tuple[int, str]] = []  # (when a tick has something to do for a receipt, receipt)
        self._next_tick = 0.0
        self._restore()

    def _restore(self) -> None:
        codec = Codec()
        for record in self.log.latest_per_key(self.state_topic).values():
            if not record.value:
                continue
            try:
                event = codec.decode(record.value).event
            except SchemaError as exc:
                self.consumer.dead_letters.send(record, exc, stage="decode")
                continue
            if isinstance(event, FeedbackJoinState):
                self.states[event.response_id] = event
                self._schedule(event)
            elif isinstance(event, SourceBaseline):
                self.baselines[event.source] = event
        logger.info("feedback joiner restored %d receipts and %d source baselines", len(self.states),
                    len(self.baselines))

    def _schedule(self, state: FeedbackJoinState) -> None:
        heapq.heappush(self._due, (FeedbackJoiner.due_ms(state, self.joiner.settings), state.response_id))

    def step(self, timeout_s: float = 0.5) -> int:
        """One pass of the commit protocol; returns the records read."""
        # Step 1
        deliveries = self.consumer.poll_batch(500, timeout_s)
        # Step 2
        for delivery in deliveries:
            event = delivery.event
            with self.consumer.process_span(delivery):
                if isinstance(event, ResponseServed):
                    self._apply(event.response_id, self.joiner.on_served(
                        self.states.get(event.response_id), event, self.baselines))
                elif isinstance(event, FeedbackReceived):
                    receipt = receipt_of(event) or ""
                    self._apply(receipt, self.joiner.on_feedback(self.states.get(receipt), event, self.baselines))
                else:
                    self.consumer.dead_letter(delivery, f"a {event.type} event does not belong on {delivery.record.topic}")
        # Step 3
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.tick_s
            now = now_ms()
            while self._due and self._due[0][0] <= now:
                receipt = heapq.heappop(self._due)[1]
                if receipt in self.states:
                    self._apply(receipt, self.joiner.on_tick(self.states[receipt], now=now))
        # Steps 4 and 5
        self.store_and_commit(self.pending.drain())
        return len(deliveries)

    def _apply(self, receipt: str, step: JoinStep) -> None:
        if step.duplicate:
            self.stats["duplicates"] += 1
        for event in step.events:
            self._send(event, step.state)
        for source, baseline in step.baselines.items():
            self.baselines[source] = baseline
            self.pending.add([(BASELINE_KEY + source, baseline)])
        if not receipt:  # feedback with no receipt: dropped, nothing to hold
            return
        before = self.states.get(receipt)
        if step.state is None:
            if before is not None:
                self.states.pop(receipt)
                self.pending.add([(receipt, None)])
        elif step.state != before:
            self.states[receipt] = step.state
            self.pending.add([(receipt, step.state)])
            self._schedule(step.state)
        for record in step.messages:  # every receipt is held here: a message is applied at once
            self._apply(record.to, self.joiner.on_partner(self.states.get(record.to), record, self.baselines))

    def _send(self, event: Event, state: FeedbackJoinState | None) -> None:
        if isinstance(event, ScoredRollout):
            with joining_span(event, state):
                self.producer.send(self.topics.scored, event, key=event.rollout.group_id)
            self.stats["samples"] += 1
        else:
            self.producer.send(self.topics.drops, event, key=getattr(event, "group_id", None) or "feedback")
            self.stats["dropped"] += 1
