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

import logging
import time
from collections.abc import Iterable, Iterator

from rollwire.core.bus import DeadLetters, EventConsumer, EventLog, EventProducer
from rollwire.core.bus.base import Record
from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas.base import Event
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.scorer import ScorerGroupState
from rollwire.schemas.topics import Topics
from rollwire.streams import group_changelog
from rollwire.streams.host import Output
from rollwire.streams.in_process import InProcessDriver
from rollwire.streams.scorer_host import ScorerHost
from rollwire.streams.scoring import GroupScorer, GroupState, scoring_span

logger = logging.getLogger(__name__)


class RestoredGroups:
    """The groups of the partitions owned, rebuilt from the changelog (`ScorerHost`'s store)."""

    def __init__(self, states: dict[str, ScorerGroupState], partitions: int) -> None:
        self.states, self.partitions = states, partitions

    def group(self, group_id: str) -> ScorerGroupState | None:
        return self.states.pop(group_id, None)  # the host holds it from now on

    def group_ids(self, partition: int) -> Iterable[str]:
        return [g for g in self.states if partition_for(g.encode(), self.partitions) == partition]


class EmbeddedScorer(InProcessDriver):
    """One scorer process: owns the groups of the rollout partitions its consumer is assigned."""

    def __init__(self, log: EventLog, topics: Topics, scorer: GroupScorer, *, group_id: str = "scorer",
                 name: str = "scorer", tick_s: float = 1.0, session_timeout_s: float = 10.0) -> None:
        self.log, self.topics, self.tick_s = log, topics, tick_s
        self.state_topic = topics.name("scorer-state")
        self.producer = EventProducer(log.producer(), topics, name=name)
        self.consumer = EventConsumer(log.consumer([topics.rollouts], group_id, session_timeout_s=session_timeout_s),
                                      DeadLetters(self.producer, name), group=group_id)
        self.partitions = log.partitions(topics.rollouts)
        self.host = ScorerHost(scorer, self.partitions)
        self.stats = self.host.stats
        self._owned: frozenset[int] = frozenset()
        self._next_tick = 0.0
        self._codec = Codec()

    @property
    def states(self) -> dict[str, GroupState]:
        """The groups held now (after a step: every one restored is read by its first tick; a
        closed one as a `ClosedGroup`)."""
        return self.host.held()

    def _restore(self, owned: frozenset[int]) -> None:
        """Rebuilds every group on the partitions this process now owns from the changelog."""
        states = group_changelog.restore(
            self._decoded(self.log.latest_per_key(self.state_topic).values()),
            owns=lambda group_id: partition_for(group_id.encode(), self.partitions) in owned)
        self.host.reset(RestoredGroups(states, self.partitions))
        logger.info("scorer owns rollout partitions %s: restored %d groups", sorted(owned), len(states))

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
            with self.consumer.process_span(delivery):
                applied = self.host.rollout(delivery.event)
                if applied.rejected:
                    self.consumer.dead_letter(delivery, applied.rejected)
                self._send(applied.outputs)
        # Step 3
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.tick_s
            self._send(self.host.tick(partitions=sorted(self._owned)))
        # Steps 4 and 5: a group's records stay together, on its rollouts' partition
        self.store_and_commit(self.host.writes(), partition_of=lambda key: partition_for(
            key.split(group_changelog.SEPARATOR, 1)[0].encode(), self.partitions))
        return len(deliveries)

    def _send(self, outputs: list[Output]) -> None:
        for out in outputs:
            with scoring_span(out.event):
                self.producer.send(self.topics.name(out.topic), out.event, key=out.key)
