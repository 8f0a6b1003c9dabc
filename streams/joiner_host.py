"""The feedback joiner's host: everything the joiner holds between events, free of any transport.

    driver ──▶ host.event(served | feedback | partner record)  ──▶ events to send
    driver ──▶ host.tick(now, partitions)                      ──▶ drops of feedback that waited too long
    driver ──▶ host.writes()                                   ──▶ changelog writes since the last call

`FeedbackJoiner` (`feedback_join.py`) is one pure step per event. The host holds what it needs
between them: each receipt's state, the receipts in the order they came (the oldest is forgotten
past `max_receipts`), each partition's source baselines, when each receipt is next due for a tick
(per partition), the changelog writes pending, and the counts. Everything about one
receipt lives on the partition its id hashes to among `joiner-in`'s partitions, in both drivers:
the faust driver (`faust_joiner.py`) routes every record there first; the in-process one
(`embedded_joiner.py`) reads the input topics and holds every partition itself. So a source's
rating baseline is a running mean per partition in both (the same estimate from a share of the
ratings), and both drivers produce the same samples from the same input
(`tests/contract/test_stream_drivers.py`).

The messages one receipt sends another about a preference (`PartnerRecord`) come back as
outputs for topic `joiner-in`: the faust driver sends them there, the in-process driver gives
them straight back to `event`.

Changelog keys (`joiner-state`, compacted): a receipt's state under the receipt; a baseline
under NUL, the source, NUL, the partition (a key from before partitions, NUL and the source
only, is read as the baseline of the partition its key hashes to).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from rollwire.core import bounds
from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, PartnerRecord, SourceBaseline
from rollwire.schemas.rollout import ScoredRollout
from rollwire.schemas.serving import ResponseServed
from rollwire.streams.feedback_join import FeedbackJoiner, JoinStep, receipt_of
from rollwire.streams.host import Held, Output, StateHost

BASELINE_KEY = "\x00"
"""Before a source's name in a baseline's changelog key (receipts never start with NUL)."""


def baseline_key(source: str, partition: int) -> str:
    return f"{BASELINE_KEY}{source}{BASELINE_KEY}{partition}"


def baseline_partition(key: str | bytes, partitions: int) -> int | None:
    """The partition a baseline's key names; None for a receipt's key."""
    text = key.decode() if isinstance(key, bytes) else key
    if not text.startswith(BASELINE_KEY):
        return None
    _, sep, partition = text[1:].rpartition(BASELINE_KEY)
    if sep and partition.isdigit():
        return int(partition)
    return partition_for(text.encode(), partitions)  # a key from before baselines were per partition


class ReceiptStore(Protocol):
    """The driver's durable copy of the receipts and baselines, as it stood at the host's last `reset`."""

    def receipt(self, receipt: str) -> FeedbackJoinState | None: ...

    def receipts(self, partition: int) -> Iterable[str]: ...

    def baselines(self, partition: int) -> dict[str, SourceBaseline]: ...


class NoReceipts:
    """A store with nothing in it (a fresh start)."""

    def receipt(self, receipt: str) -> FeedbackJoinState | None:
        return None

    def receipts(self, partition: int) -> Iterable[str]:
        return ()

    def baselines(self, partition: int) -> dict[str, SourceBaseline]:
        return {}


class JoinerHost(StateHost[FeedbackJoinState]):
    def __init__(self, joiner: FeedbackJoiner, partitions: int, store: ReceiptStore | None = None) -> None:
        super().__init__(partitions)
        self.joiner = joiner
        # `stats` counts `samples` and `dropped` sent, `duplicates` recognised, and `forgotten`
        # (receipts forgotten early for `max_receipts`)
        self.reset(store or NoReceipts())

    def reset(self, store: ReceiptStore) -> None:
        """Forgets everything decoded (the partitions owned changed); reads from `store` from now on."""
        self._store = store
        self._held = Held(store.receipt)
        self._baselines: dict[int, dict[str, SourceBaseline]] = {}
        self._schedules: dict[int, list[tuple[int, str]]] = {}
        self._order: OrderedDict[str, None] = OrderedDict()
        """The receipts held, oldest first (those restored join it when their partition is first ticked)."""

    # -- input --------------------------------------------------------------------------------

    def event(self, event: Event, now: int | None = None) -> list[Output] | None:
        """Applies a served record, a feedback item or a partner's message; None for any other event
        (the driver dead-letters it: it does not belong on the joiner's input)."""
        if isinstance(event, ResponseServed):
            receipt = event.response_id
            return self._apply(receipt, self.joiner.on_served(self.state(receipt), event, self._baselines_of(receipt),
                                                              now=now))
        if isinstance(event, FeedbackReceived):
            if (receipt_or_none := receipt_of(event)) is None:  # nothing to join: rendered from its messages, or dropped
                return self._outputs(self.joiner.on_feedback(None, event, {}, now=now))
            return self._apply(receipt_or_none, self.joiner.on_feedback(
                self.state(receipt_or_none), event, self._baselines_of(receipt_or_none), now=now))
        if isinstance(event, PartnerRecord):
            return self._apply(event.to, self.joiner.on_partner(self.state(event.to), event,
                                                                self._baselines_of(event.to), now=now))
        return None

    def tick(self, now: int | None = None, partitions: Iterable[int] | None = None) -> list[Output]:
        """Drops feedback that waited past the window and forgets old receipts, on `partitions` (default: all)."""
        now = now_ms() if now is None else now
        outputs: list[Output] = []
        for partition in range(self.partitions) if partitions is None else partitions:
            schedule = self._schedule_of(partition)
            while schedule and schedule[0][0] <= now:
                receipt = heapq.heappop(schedule)[1]
                if (state := self.state(receipt)) is not None:
                    outputs += self._apply(receipt, self.joiner.on_tick(state, now=now))
        return outputs

    # -- state --------------------------------------------------------------------------------

    def _baselines_of(self, receipt: str) -> dict[str, SourceBaseline]:
        partition = self.partition_of(receipt)
        if partition not in self._baselines:
            self._baselines[partition] = dict(self._store.baselines(partition))
        return self._baselines[partition]

    def _schedule_of(self, partition: int) -> list[tuple[int, str]]:
        if partition not in self._schedules:  # the first tick since the reset: one pass over the partition
            receipts = self._keys_in(partition, self._store.receipts(partition))
            held = {r: s for r in receipts if (s := self.state(r)) is not None}
            for r in sorted(held, key=lambda r: held[r].first_seen_ms):
                self._order.setdefault(r, None)
            self._schedules[partition] = []
            self._reschedule(partition, held)
        return self._schedules[partition]

    def _reschedule(self, partition: int, held: dict[str, FeedbackJoinState]) -> None:
        self._schedules[partition] = [(FeedbackJoiner.due_ms(s, self.joiner.settings), r) for r, s in held.items()]
        heapq.heapify(self._schedules[partition])

    def _bound(self) -> list[Output]:
        """Past `max_receipts`, the oldest receipt is forgotten."""
        outputs: list[Output] = []
        limit = self.joiner.settings.max_receipts
        while len(self._order) > limit:
            receipt = next(iter(self._order))
            state = self.state(receipt)
            if state is None:
                self._order.pop(receipt)
                continue
            self.stats["forgotten"] += 1
            bounds.noted("joiner.max_receipts", what=": feedback arriving later on a receipt forgotten early is "
                         "dropped as unjoinable")
            outputs += self._apply(receipt, self.joiner.forget(state, len(self._order)))
        return outputs

    def _compact(self, partition: int) -> None:
        """A schedule mostly of entries for receipts changed or forgotten since is rebuilt: each
        change adds an entry, and a receipt is due only days after it came."""
        schedule = self._schedules.get(partition)
        if schedule is not None and len(schedule) > 2 * len(self._order) + 1024:
            self._reschedule(partition, {r: s for r in self._order
                                         if self.partition_of(r) == partition and (s := self.state(r)) is not None})

    def _apply(self, receipt: str, step: JoinStep) -> list[Output]:
        outputs = self._outputs(step)
        partition = self.partition_of(receipt)
        for source, baseline in step.baselines.items():
            self._baselines_of(receipt)[source] = baseline
            self._pending.add([(baseline_key(source, partition), baseline)])
        before = self.state(receipt)
        if step.state is None:
            self._order.pop(receipt, None)
            if before is not None:
                self._held.put(receipt, None)
                self._pending.add([(receipt, None)])
        elif step.state != before:
            self._held.put(receipt, step.state)
            self._pending.add([(receipt, step.state)])
            self._order.setdefault(receipt, None)
            if partition in self._schedules:
                heapq.heappush(self._schedules[partition], (FeedbackJoiner.due_ms(step.state, self.joiner.settings),
                                                            receipt))
        outputs += [Output("joiner-in", message, message.to) for message in step.messages]
        if len(self._order) > self.joiner.settings.max_receipts:
            outputs += self._bound()
        self._compact(partition)
        return outputs

    def _outputs(self, step: JoinStep) -> list[Output]:
        if step.duplicate:
            self.stats["duplicates"] += 1
        outputs = []
        for event in step.events:
            if isinstance(event, ScoredRollout):
                outputs.append(Output("scored", event, event.rollout.group_id, made_by=step.state))
                self.stats["samples"] += 1
            else:
                outputs.append(Output("drops", event, getattr(event, "group_id", None) or "feedback", made_by=step.state))
                self.stats["dropped"] += 1
        return outputs
