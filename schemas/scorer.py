"""The group scorer's own records: the state of each group (its changelog) and timer ticks.

Both drivers of the scorer — faust-streaming on Kafka and the in-process embedded driver — keep
group state on the same compacted topic, so a restarted scorer rebuilds exactly what it held.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.rollout import RolloutCompleted


class ScorerGroupState(Event):
    """What the scorer holds for one group.

    Produced by the group scorer on `scorer-state` (compacted; key: group id) when the group
    opens and when it closes, without its rollouts (those are `ScorerGroupRollout` records);
    consumed by the group scorer when it restores its table on start. A tombstone (empty value)
    forgets a closed group once `retain_closed_s` has passed. In memory the scorer holds the
    open group's rollouts here, ordered by sample index.
    """

    type: Literal["scorer.group_state"] = "scorer.group_state"
    group_id: str
    """The group."""
    environment: str
    """Environment of the group's rollouts."""
    algorithm: str
    """Advantage algorithm the group's rollouts name."""
    group_size: int = Field(ge=1)
    """Declared rollouts per group."""
    first_seen_ms: int
    """When the scorer received the group's first rollout (epoch ms); the timeout counts from it."""
    rollouts: list[RolloutCompleted] = Field(default_factory=list)
    """Rollouts held while the group is open; empty once closed."""
    rollout_ids: list[str] = Field(default_factory=list)
    """Every rollout id received for the group, kept after closing to recognise redeliveries."""
    closed_at_ms: int | None = None
    """When the group was scored or dropped (epoch ms); None while open."""


class ScorerGroupRollout(Event):
    """One rollout an open group holds: the scorer's changelog grows by these, one per rollout,
    instead of rewriting the whole group (`streams/group_changelog.py`).

    Produced by the group scorer on `scorer-state` (compacted; key: group id, NUL, sample index)
    when the rollout arrives, tombstoned when its group closes; consumed by the group scorer when
    it restores its table on start.
    """

    type: Literal["scorer.group_rollout"] = "scorer.group_rollout"
    rollout: RolloutCompleted
    """The rollout as the env worker published it."""


class ScorerTick(Event):
    """A timer tick that lets the faust scorer expire groups inside stream processing.

    Produced by the group scorer's timer on `scorer-ticks` (one per partition, co-partitioned
    with `rollouts`); consumed by the same scorer, which times out the open groups of that
    partition. (Faust tables may only change while processing a record of their partition.)
    """

    type: Literal["scorer.tick"] = "scorer.tick"
    at_ms: int = Field(default_factory=now_ms)
    """When the tick was sent (epoch ms)."""
