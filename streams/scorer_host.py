"""The group scorer's host: everything the scorer holds between events, free of any transport.

    driver ──▶ host.rollout(rollout)        ──▶ Applied: events to send, or why to dead-letter it
    driver ──▶ host.tick(now, partitions)   ──▶ events to send (timeouts, forgetting)
    driver ──▶ host.writes()                ──▶ the changelog writes since the last call, coalesced

`GroupScorer` (`scoring.py`) is one pure step per rollout or tick. The host is what turns it into a
processor: the groups held (decoded, by group id), when each is next due (`Deadlines`, per rollout
partition), the groups open against `max_open_groups` (`OpenGroups`, per partition, the limit over
all of them), the changelog writes pending (`group_changelog.PendingWrites`), and the counts.
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

from rollwire.schemas.base import now_ms
from rollwire.schemas.rollout import RolloutCompleted
from rollwire.schemas.scorer import ScorerGroupState
from rollwire.streams import group_changelog
from rollwire.streams.host import Applied, Held, Output, StateHost
from rollwire.streams.scoring import Deadlines, GroupScorer, OpenGroups, Step, route


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


class ScorerHost(StateHost[ScorerGroupState]):
    def __init__(self, scorer: GroupScorer, partitions: int, store: GroupStore | None = None) -> None:
        super().__init__(partitions)
        self.scorer = scorer
        # `stats` counts `rollout.scored` and `rollouts.dropped` events sent, `dead_lettered`,
        # `duplicates`, and `overflow` (groups closed early for `max_open_groups`)
        self.reset(store or NoGroups())

    def reset(self, store: GroupStore) -> None:
        """Forgets everything decoded (the partitions owned changed) and reads from `store` from now on.
        Writes not yet taken by `writes()` are kept: they belong to groups still stored."""
        self._store = store
        self._held = Held(store.group)
        self._deadlines: dict[int, Deadlines] = {}
        self._open: dict[int, OpenGroups] = {}

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
        return outputs

    # -- state --------------------------------------------------------------------------------

    def open_groups(self) -> int:
        """Groups held open now, over every partition read so far."""
        return sum(len(o) for o in self._open.values())

    def _ids_in(self, partition: int) -> list[str]:
        return self._keys_in(partition, self._store.group_ids(partition))

    def _due_in(self, partition: int) -> Deadlines:
        if partition not in self._deadlines:  # the first need since the reset: one pass over the partition
            self._deadlines[partition] = Deadlines(self.scorer.settings)
            for group_id in self._ids_in(partition):
                self._deadlines[partition].push(group_id, self.state(group_id))
        return self._deadlines[partition]

    def _open_in(self, partition: int) -> OpenGroups:
        if partition not in self._open:
            self._open[partition] = OpenGroups.of(self.scorer.settings.max_open_groups,
                                                  ((g, self.state(g)) for g in self._ids_in(partition)))
        return self._open[partition]

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
            if group_id is not None and (state := self.state(group_id)) is not None:
                oldest.append((state.first_seen_ms, group_id, state))
        if not oldest:
            return []
        _, group_id, state = min(oldest, key=lambda o: o[:2])
        self.stats["overflow"] += 1
        return self._apply(group_id, self.scorer.overflow(state, held_open))

    def _apply(self, group_id: str, step: Step) -> list[Output]:
        if step.duplicate:
            self.stats["duplicates"] += 1
        outputs = [Output(route(event), event, group_id) for event in step.events]
        for event in step.events:
            self.stats[event.type] += 1
        self._pending.add(group_changelog.writes(group_id, self.state(group_id), step))
        if step.changed:
            self._held.put(group_id, step.state)
            partition = self.partition_of(group_id)
            if partition in self._deadlines:
                self._deadlines[partition].push(group_id, step.state)
            if partition in self._open:
                self._open[partition].note(group_id, step.state)
        return outputs
