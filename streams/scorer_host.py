"""The group scorer's host: everything the scorer holds between events, free of any transport.

    driver ──▶ host.rollout(rollout)        ──▶ Applied: events to send, or why to dead-letter it
    driver ──▶ host.tick(now, partitions)   ──▶ events to send (timeouts, forgetting)
    driver ──▶ host.writes()                ──▶ the changelog writes since the last call, coalesced

`GroupScorer` (`scoring.py`) is one pure step per rollout or tick. The host is what turns it into a
processor: the groups held (decoded, by group id; a closed one compact, as a `ClosedGroup`), when
each open group times out (`Deadlines`, per rollout partition), the groups open and closed in
order (`GroupOrder`, per partition: the oldest open group makes room past `max_open_groups`, the
oldest closed one is forgotten past `retain_closed_s` or `max_closed_groups`, both limits over
all partitions), the changelog writes pending (`group_changelog.PendingWrites`), and the counts.
Both drivers only feed it and persist what it returns: the in-process one (`embedded_scorer.py`)
over any event log, the faust one (`faust_app.py`) on Kafka; `tests/contract/test_stream_drivers.py`
runs the same input through both and compares what comes out.

Groups the host has not seen since its last `reset` are read from its `GroupStore`, the driver's
durable copy (the changelog restored, or faust's table), the first time they are needed: a faust
table is recovered only after its partitions are assigned, so nothing is read at assignment.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from rollwire.core import bounds
from rollwire.schemas.base import now_ms
from rollwire.schemas.rollout import RolloutCompleted
from rollwire.schemas.scorer import ScorerGroupState
from rollwire.streams import group_changelog
from rollwire.streams.host import Applied, Held, Output, StateHost
from rollwire.streams.scoring import Deadlines, GroupOrder, GroupScorer, GroupState, Step, compact, route


class GroupStore(Protocol):
    """The driver's durable copy of the groups, as it stood at the host's last `reset`."""

    def group(self, group_id: str) -> ScorerGroupState | None: ...

    def group_ids(self, partition: int) -> Iterable[str]:
        """Every group stored on rollout partition `partition`."""
        ...


class NoGroups:
    """A store with nothing in it (a fresh start)."""

    def group(self, group_id: str) -> ScorerGroupState | None:
        return None

    def group_ids(self, partition: int) -> Iterable[str]:
        return ()


class ScorerHost(StateHost[GroupState]):
    def __init__(self, scorer: GroupScorer, partitions: int, store: GroupStore | None = None) -> None:
        super().__init__(partitions)
        self.scorer = scorer
        # `stats` counts `rollout.scored` and `rollouts.dropped` events sent, `dead_lettered`,
        # `duplicates`, `overflow` (groups closed early for `max_open_groups`) and `forgotten`
        # (closed groups forgotten early for `max_closed_groups`)
        self.reset(store or NoGroups())

    def reset(self, store: GroupStore) -> None:
        """Forgets everything decoded (the partitions owned changed) and reads from `store` from now on.
        Writes not yet taken by `writes()` are kept: they belong to groups still stored."""
        self._store = store
        self._held = Held(lambda group_id: compact(store.group(group_id)))
        self._deadlines: dict[int, Deadlines] = {}
        self._open: dict[int, GroupOrder] = {}
        self._closed: dict[int, GroupOrder] = {}

    # -- input --------------------------------------------------------------------------------

    def rollout(self, rollout: RolloutCompleted, now: int | None = None) -> Applied:
        group_id = rollout.group_id
        applied = Applied()
        if self.state(group_id) is None:
            applied.outputs += self._make_room()
        step = self.scorer.on_rollout(self.state(group_id), rollout, now=now)
        if step.rejected:
            applied.rejected = step.rejected
            self.stats["dead_lettered"] += 1
        applied.outputs += self._apply(group_id, step)
        return applied

    def tick(self, now: int | None = None, partitions: Iterable[int] | None = None) -> list[Output]:
        """Closes the groups of `partitions` (default: all) past their timeout; forgets closed ones
        past `retain_closed_s`."""
        now = now_ms() if now is None else now
        outputs: list[Output] = []
        for partition in range(self.partitions) if partitions is None else partitions:
            for group_id in self._due_in(partition).due(now):
                state = self.state(group_id)
                if state is not None:
                    outputs += self._apply(group_id, self.scorer.on_tick(state, now=now))
            closed = self._closed_in(partition)
            while (oldest := closed.oldest()) is not None:  # oldest first: stop at the first one kept
                state = self.state(oldest)
                step = self.scorer.on_tick(state, now=now) if state is not None else Step(None, changed=True)
                if not step.changed:
                    break
                outputs += self._apply(oldest, step)
        return outputs

    # -- state --------------------------------------------------------------------------------

    def open_groups(self) -> int:
        """Groups held open now, over every partition read so far."""
        return sum(len(o) for o in self._open.values())

    def _ids_in(self, partition: int) -> list[str]:
        return self._keys_in(partition, self._store.group_ids(partition))

    def closed_groups(self) -> int:
        """Closed groups remembered now, over every partition read so far."""
        return sum(len(c) for c in self._closed.values())

    def _due_in(self, partition: int) -> Deadlines:
        """The open groups' timeouts (closed groups are forgotten in `_closed_in`'s order)."""
        if partition not in self._deadlines:  # the first need since the reset: one pass over the partition
            self._deadlines[partition] = Deadlines(self.scorer.settings)
            for group_id in self._open_in(partition):
                self._deadlines[partition].push(group_id, self.state(group_id))
        return self._deadlines[partition]

    def _open_in(self, partition: int) -> GroupOrder:
        if partition not in self._open:
            self._open[partition] = GroupOrder.of(((g, self.state(g)) for g in self._ids_in(partition)), closed=False)
        return self._open[partition]

    def _closed_in(self, partition: int) -> GroupOrder:
        if partition not in self._closed:
            self._closed[partition] = GroupOrder.of(((g, self.state(g)) for g in self._ids_in(partition)), closed=True)
        return self._closed[partition]

    def _make_room(self) -> list[Output]:
        """Before a group opens: past `max_open_groups` (over every partition held), the oldest open
        group is closed early and its rollouts dropped."""
        for p in range(self.partitions):
            self._open_in(p)
        held_open = self.open_groups()
        if held_open < self.scorer.settings.max_open_groups:
            return []
        oldest: list[tuple[int, str, ScorerGroupState]] = []  # each partition's oldest open group
        for opened in self._open.values():
            group_id = opened.oldest()
            if group_id is not None and isinstance(state := self.state(group_id), ScorerGroupState):
                oldest.append((state.first_seen_ms, group_id, state))
        if not oldest:
            return []
        _, group_id, state = min(oldest, key=lambda o: o[:2])
        self.stats["overflow"] += 1
        return self._apply(group_id, self.scorer.overflow(state, held_open))

    def _forget_beyond_bound(self) -> list[Output]:
        """Past `max_closed_groups` (over every partition held), the oldest closed group is forgotten
        before its `retain_closed_s`."""
        for p in range(self.partitions):
            self._closed_in(p)
        held_closed, limit = self.closed_groups(), self.scorer.settings.max_closed_groups
        if held_closed <= limit:
            return []
        oldest: list[tuple[int, str]] = []  # each partition's oldest closed group
        for closed in self._closed.values():
            group_id = closed.oldest()
            if group_id is not None and (state := self.state(group_id)) is not None:
                oldest.append((state.closed_at_ms or 0, group_id))
        outputs: list[Output] = []
        for _, group_id in sorted(oldest)[:held_closed - limit]:  # one close at a time: at most one over
            self.stats["forgotten"] += 1
            bounds.noted("scorer.max_closed_groups", what=": a rollout of a group forgotten early, "
                         "if delivered again, would be scored again")
            outputs += self._apply(group_id, Step(None, changed=True))
        return outputs

    def _apply(self, group_id: str, step: Step) -> list[Output]:
        if step.duplicate:
            self.stats["duplicates"] += 1
        outputs = [Output(route(event), event, group_id) for event in step.events]
        for event in step.events:
            self.stats[event.type] += 1
        before = self.state(group_id)
        self._pending.add(group_changelog.writes(group_id, before, step))
        if step.changed:
            held = compact(step.state) if isinstance(step.state, ScorerGroupState) else step.state
            self._held.put(group_id, held)
            partition = self.partition_of(group_id)
            if partition in self._deadlines and before is None and held is not None and held.closed_at_ms is None:
                self._deadlines[partition].push(group_id, held)  # an open group's timeout never moves
            for order in (self._open, self._closed):
                if partition in order:
                    order[partition].note(group_id, held)
            if held is not None and held.closed_at_ms is not None:
                outputs += self._forget_beyond_bound()
        return outputs
