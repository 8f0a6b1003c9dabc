"""How the scorer's group table is written to `scorer-state` and rebuilt from it: by deltas.

A group of k rollouts costs k rollout records, not k copies of a growing group:

    key  <group id>                      ScorerGroupState without rollouts: written when the group
                                         opens and when it closes (then with every rollout id),
                                         tombstoned when a closed group is forgotten
    key  <group id> NUL <sample index>   ScorerGroupRollout, the rollout itself: written once when it
                                         arrives, tombstoned when its group closes

Writes for one step go out in this order (the closed header before the tombstones of its rollouts),
so a crash part-way leaves either the open group as it was, or a closed group with leftover
rollout records, which restoring ignores and forgetting the group removes. Drivers gather a
batch's writes in `PendingWrites`, which coalesces them per key and keeps that order.

Both drivers use this module: the embedded driver sends `writes(...)` to the topic and restores
with `restore(...)`; the faust driver applies the same writes to its table (faust turns them into
changelog records) and rebuilds a group from the table with `assemble(...)`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from rollwire.schemas.base import Event
from rollwire.schemas.rollout import RolloutCompleted
from rollwire.schemas.scorer import ScorerGroupRollout, ScorerGroupState
from rollwire.streams.scoring import GroupState, Step

SEPARATOR = "\x00"
"""Between a group id and a sample index in a rollout record's key (group ids never hold NUL)."""

Write = tuple[str, Event | None]
"""`(key, event)`; None is a tombstone."""


def rollout_key(group_id: str, sample_index: int) -> str:
    return f"{group_id}{SEPARATOR}{sample_index}"


def is_group_key(key: str | bytes) -> bool:
    """True for a group's header key, False for one of its rollout records."""
    if isinstance(key, bytes):
        return SEPARATOR.encode() not in key
    return SEPARATOR not in key


def header(state: ScorerGroupState) -> ScorerGroupState:
    """What the group record holds: an open group's rollouts (and their ids) live in their own records."""
    if state.closed_at_ms is not None:
        return state.model_copy(update={"rollouts": []})
    return state.model_copy(update={"rollouts": [], "rollout_ids": []})


def writes(group_id: str, before: GroupState | None, step: Step) -> list[Write]:
    """The records that take the table from `before` to `step.state` (never a `ClosedGroup`: a
    group closes in the step that writes its ids)."""
    if not step.changed:
        return []
    after = step.state
    if after is None:  # a closed group forgotten; any rollout records a crash left go with it
        held = before.group_size if before is not None else 0
        forgotten: list[Write] = [(group_id, None)]
        return forgotten + [(rollout_key(group_id, i), None) for i in range(held)]
    if not isinstance(after, ScorerGroupState):
        raise TypeError(f"group {group_id}: a compact closed group has no record to write")
    open_before = isinstance(before, ScorerGroupState) and before.closed_at_ms is None
    held_before = before.rollouts if open_before and isinstance(before, ScorerGroupState) else []
    if after.closed_at_ms is not None:
        return [(group_id, header(after))] + [(rollout_key(group_id, r.sample_index), None) for r in held_before]
    known = {r.rollout_id for r in held_before}
    out: list[Write] = [] if before is not None else [(group_id, header(after))]
    out += [(rollout_key(group_id, r.sample_index), ScorerGroupRollout(rollout=r))
            for r in after.rollouts if r.rollout_id not in known]
    return out


class PendingWrites:
    """The changelog writes of one commit, coalesced per key before they are sent, as Kafka
    Streams' record cache does: a key keeps its last write only, and a record both written and
    tombstoned since the last flush is never sent (its group opened and closed in one batch).
    Keys keep the order of their first write, which keeps a closed header ahead of the
    tombstones of its group's older rollout records."""

    def __init__(self) -> None:
        self._writes: dict[str, Event | None] = {}
        self._new: set[str] = set()
        """Keys first written since the last flush as a record: nothing of theirs is in the log yet."""

    def add(self, writes: Iterable[Write]) -> None:
        for key, record in writes:
            if key not in self._writes and record is not None:
                self._new.add(key)
            if record is None and key in self._new:
                self._writes.pop(key)
                self._new.discard(key)
                continue
            self._writes[key] = record

    def drain(self) -> list[Write]:
        """The writes to send now, in order; empties the buffer."""
        out = list(self._writes.items())
        self._writes, self._new = {}, set()
        return out

    def __len__(self) -> int:
        return len(self._writes)


def assemble(group: ScorerGroupState, rollouts: Iterable[RolloutCompleted]) -> ScorerGroupState:
    """A group as the scorer holds it, from its header record and its rollout records."""
    if group.closed_at_ms is not None:
        return group
    merged = {r.rollout_id: r for r in [*group.rollouts, *rollouts]}  # headers written before deltas held rollouts
    held = sorted(merged.values(), key=lambda r: r.sample_index)
    return group.model_copy(update={"rollouts": held, "rollout_ids": [r.rollout_id for r in held]})


def restore(events: Iterable[Event], owns: Callable[[str], bool] = lambda group_id: True) -> dict[str, ScorerGroupState]:
    """Every group `owns` accepts, from the latest record per key of the changelog."""
    groups: dict[str, ScorerGroupState] = {}
    rollouts: defaultdict[str, list[RolloutCompleted]] = defaultdict(list)
    for event in events:
        if isinstance(event, ScorerGroupState) and owns(event.group_id):
            groups[event.group_id] = event
        elif isinstance(event, ScorerGroupRollout) and owns(event.rollout.group_id):
            rollouts[event.rollout.group_id].append(event.rollout)
    return {gid: assemble(group, rollouts.get(gid, ())) for gid, group in groups.items()}
