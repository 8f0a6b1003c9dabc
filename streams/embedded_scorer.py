"""The group scorer driven in-process over any event log (the embedded default; Kafka works too).

    reads:  <prefix>.rollouts      (consumer group `scorer`)
    writes: <prefix>.scored, <prefix>.drops, <prefix>.deadletter,
            <prefix>.scorer-state  (compacted changelog of the group table, one record per
                                    rollout: `group_changelog.py`; read back on start)

The commit protocol of one `step`:

    # Step 1  poll a batch of rollouts (undecodable records are dead-lettered by the consumer)
    # Step 2  apply each to its group's state; queue scored and dropped events and dead letters
    #         for rejected rollouts; gather the state changes
    # Step 3  every `tick_s`, time out the open groups due and forget the closed ones due
    # Step 4  send the state changes, coalesced per key (a group that opened and closed in this
    #         batch leaves only its closed header); flush the producer: outputs and state are durable
    # Step 5  commit the consumer's offsets

A crash before Step 5 replays the batch: rollouts already in a restored state are recognised
by id and ignored, so a group is scored once; a crash between Steps 4 and 5 after a group
closed can score it again, which the trainer's dedupe on rollout id absorbs (at-least-once).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable, Iterator

from rollwire.core.bus import DeadLetters, EventConsumer, EventLog, EventProducer
from rollwire.core.bus.base import Record
from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.scorer import ScorerGroupState
from rollwire.schemas.topics import Topics
from rollwire.streams import group_changelog
from rollwire.streams.in_process import InProcessDriver
from rollwire.streams.scoring import Deadlines, GroupScorer, OpenGroups, Step, route, scoring_span

logger = logging.getLogger(__name__)


class EmbeddedScorer(InProcessDriver):
    """One scorer process: owns the groups of the rollout partitions its consumer is assigned."""

    def __init__(self, log: EventLog, topics: Topics, scorer: GroupScorer, *, group_id: str = "scorer",
                 name: str = "scorer", tick_s: float = 1.0, session_timeout_s: float = 10.0) -> None:
        self.log, self.topics, self.scorer, self.tick_s = log, topics, scorer, tick_s
        self.state_topic = topics.name("scorer-state")
        self.producer = EventProducer(log.producer(), topics, name=name)
        self.consumer = EventConsumer(log.consumer([topics.rollouts], group_id, session_timeout_s=session_timeout_s),
                                      DeadLetters(self.producer, name), group=group_id)
        self.partitions = log.partitions(topics.rollouts)
        self.states: dict[str, ScorerGroupState] = {}
        self.stats: collections.Counter[str] = collections.Counter()
        self._owned: frozenset[int] = frozenset()
        self._next_tick = 0.0
        self._codec = Codec()
        self.deadlines = Deadlines(scorer.settings)
        """When each held group is next due for `on_tick`: a tick visits those only."""
        self.open = OpenGroups(scorer.settings.max_open_groups)
        """The groups held open, oldest first (`max_open_groups`)."""
        self.pending = group_changelog.PendingWrites()
        """Changelog writes of this step, sent (coalesced) just before the flush."""

    def _restore(self, owned: frozenset[int]) -> None:
        """Rebuilds every group on the partitions this process now owns from the changelog."""
        self.states = group_changelog.restore(
            self._decoded(self.log.latest_per_key(self.state_topic).values()),
            owns=lambda group_id: partition_for(group_id.encode(), self.partitions) in owned)
        self.deadlines = Deadlines(self.scorer.settings)
        for group_id, state in self.states.items():
            self.deadlines.push(group_id, state)
        self.open = OpenGroups.of(self.scorer.settings.max_open_groups, self.states.items())
        logger.info("scorer owns rollout partitions %s: restored %d groups", sorted(owned), len(self.states))

    def _decoded(self, records: Iterable[Record]) -> Iterator[Event]:
        """The changelog's events; a record that does not decode is dead-lettered, and its group
        (or rollout) is restored without it."""
        for record in records:
            if not record.value:
                continue
            try:
                yield self._codec.decode(record.value).event
            except SchemaError as exc:
                self.consumer.dead_letters.send(record, exc, stage="decode")

    def step(self, timeout_s: float = 0.5) -> int:
        """One pass of the commit protocol; returns the rollouts read."""
        # Step 1
        deliveries = self.consumer.poll_batch(500, timeout_s)
        owned = frozenset(p for _, p in self.consumer.assignment())
        if owned != self._owned:
            self._owned = owned
            self._restore(owned)
        # Step 2
        for delivery in deliveries:
            rollout = delivery.event
            with self.consumer.process_span(delivery):
                if rollout.group_id not in self.states and len(self.open) >= self.open.limit:
                    self._make_room()
                result = self.scorer.on_rollout(self.states.get(rollout.group_id), rollout)
                if result.rejected:
                    self.consumer.dead_letter(delivery, result.rejected)
                    self.stats["dead_lettered"] += 1
                self._apply(rollout.group_id, result)
        # Step 3
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.tick_s
            now = now_ms()
            for group_id in self.deadlines.due(now):
                if group_id in self.states:
                    self._apply(group_id, self.scorer.on_tick(self.states[group_id], now=now))
        # Steps 4 and 5: a group's records stay together, on its rollouts' partition
        self.store_and_commit(self.pending.drain(), partition_of=lambda key: partition_for(
            key.split(group_changelog.SEPARATOR, 1)[0].encode(), self.partitions))
        return len(deliveries)

    def _make_room(self) -> None:
        oldest = self.open.oldest()
        if oldest is not None:
            self._apply(oldest, self.scorer.overflow(self.states[oldest], len(self.open)))
            self.stats["overflow"] += 1

    def _apply(self, group_id: str, result: Step) -> None:
        if result.duplicate:
            self.stats["duplicates"] += 1
        for event in result.events:
            with scoring_span(event):
                self.producer.send(self.topics.name(route(event)), event, key=group_id)
            self.stats[event.type] += 1
        self.pending.add(group_changelog.writes(group_id, self.states.get(group_id), result))
        if result.changed and result.state is None:
            self.states.pop(group_id, None)
        elif result.changed:
            self.states[group_id] = result.state
            self.deadlines.push(group_id, result.state)
        self.open.note(group_id, self.states.get(group_id))
