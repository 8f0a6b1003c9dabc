"""The group scorer's logic, free of any transport: one pure step per rollout or tick.

    rollouts ──▶ GroupScorer.on_rollout(state, rollout) ──▶ new state + scored / dropped events
    ticks    ──▶ GroupScorer.on_tick(state)             ──▶ timeouts: partial score or drop

A group closes when `group_size` rollouts have arrived, or when `group_timeout_s` passes after
its first rollout (scored if at least `min_group_size` rollouts are usable, else dropped with
reason `group_timeout`). Closing applies the environment's group rewards, then the advantage
estimator the rollouts name. Errored rollouts close groups but are never trained: they leave as
`RolloutsDropped(reason="errored")`. Both drivers (faust on Kafka, embedded) call these methods
and only persist states and send events.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field

from rollwire.core import telemetry
from rollwire.core.bounds import digest
from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout
from rollwire.schemas.scorer import ScorerGroupState
from rollwire.schemas.training import RolloutsDropped
from rollwire.streams import advantages
from rollwire.streams.advantages import GroupSample, UnknownAlgorithmError
from rollwire.streams.group_rewards import GroupRewardSpec, resolve
from rollwire.streams.teacher import TeacherClient, TeacherSettings

CLOSED_GROUP_BYTES = 500
"""At most what one closed group of 8 rollouts costs the scorer's memory: its `ClosedGroup` (~190 B),
its group id (~80 B for a uuid) and its places in the maps that hold it (~100 B);
`tests/unit/test_bounds.py` measures it (~420 B; the whole closed state it replaces cost ~1.9 KB)."""

TeacherLogprobs = Callable[[Sequence[int], Sequence[int]], list[float]]
"""`(prompt_token_ids, completion_token_ids) -> teacher logprob of each completion token`."""


def route(event: Event) -> str:
    """The catalog topic (short name) each scorer output goes to."""
    return {ScoredRollout: "scored", RolloutsDropped: "drops"}[type(event)]


class ScorerSettings(BaseModel):
    """Settings of the group scorer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    group_timeout_s: float = Field(default=300.0, gt=0)
    """Seconds after a group's first rollout before it is closed incomplete."""
    min_group_size: int = Field(default=2, ge=1)
    """Fewest usable rollouts a group needs to be scored; smaller groups are dropped."""
    max_group_size: int = Field(default=1024, ge=1)
    """Most rollouts a group may declare: the scorer holds a whole group, so a rollout of a larger one
    is dead-lettered with the reason instead of held."""
    max_open_groups: int = Field(default=100_000, ge=1)
    """Most groups one scorer process holds open (waiting for members). Before a new group would
    pass it, the oldest open group is closed early and its rollouts dropped (`overflow`, counted):
    the scorer's memory stays bounded whatever arrives, e.g. groups whose members never come."""
    retain_closed_s: float = Field(default=3600.0, ge=0)
    """How long a closed group's rollout ids are remembered to recognise redeliveries."""
    max_closed_groups: int = Field(default=100_000, ge=1)
    """Most closed groups one scorer process remembers (as `ClosedGroup`: at most
    `CLOSED_GROUP_BYTES`, 500 B, each: ~50 MB at the default). Past it the oldest is forgotten before
    `retain_closed_s` (counted): a redelivery of its rollouts would then be scored again."""
    group_rewards: dict[str, list[GroupRewardSpec]] = Field(default_factory=dict)
    """Group rewards per environment name; the key `*` applies to every environment."""
    teacher: TeacherSettings | None = None
    """The teacher endpoint for on-policy distillation; None when no environment distills."""


class ClosedGroup:
    """A closed group as the scorer remembers it for `retain_closed_s`: enough to recognise a
    redelivered rollout and to refuse a late one. It holds 8-byte digests of the rollout ids, not
    the ids or the rollouts: the changelog's record of the group keeps the ids."""

    __slots__ = ("group_size", "closed_at_ms", "_digests")
    group_size: int
    closed_at_ms: int

    def __init__(self, state: ScorerGroupState) -> None:
        if state.closed_at_ms is None:
            raise ValueError(f"group {state.group_id} is still open")
        self.group_size = state.group_size
        self.closed_at_ms = state.closed_at_ms
        self._digests = b"".join(digest(rid).to_bytes(8, "little") for rid in state.rollout_ids)

    def holds(self, rollout_id: str) -> bool:
        wanted = digest(rollout_id).to_bytes(8, "little")
        at = self._digests.find(wanted)
        while at != -1 and at % 8:  # a match across two digests is not one
            at = self._digests.find(wanted, at + 1)
        return at != -1

    def __len__(self) -> int:
        return len(self._digests) // 8


GroupState = ScorerGroupState | ClosedGroup
"""A group as a driver holds it: open with its rollouts, or closed and compact."""


def compact(state: ScorerGroupState | None) -> GroupState | None:
    """What to hold of a group: a closed one as a `ClosedGroup`."""
    return ClosedGroup(state) if state is not None and state.closed_at_ms is not None else state


def _holds(state: GroupState, rollout_id: str) -> bool:
    return state.holds(rollout_id) if isinstance(state, ClosedGroup) else rollout_id in state.rollout_ids


@dataclass
class Step:
    """What one call produced: the group's new state and the events to send."""

    state: GroupState | None
    """The state to store; None deletes it (a tombstone)."""
    events: list[Event] = field(default_factory=list)
    """`ScoredRollout` and `RolloutsDropped` events, keyed by group id when sent."""
    rejected: str | None = None
    """Why the rollout is unusable: the driver dead-letters it with this reason."""
    duplicate: bool = False
    """The rollout was seen before (a redelivery): nothing changed."""
    changed: bool = False
    """The state differs from the one passed in and must be stored."""


class GroupScorer:
    """Holds no group data itself: drivers pass each group's state in and store what comes out."""

    def __init__(self, settings: ScorerSettings, *, teacher: TeacherLogprobs | None = None) -> None:
        self.settings = settings
        if teacher is None and settings.teacher is not None:
            teacher = TeacherClient(settings.teacher)
        self._teacher = teacher
        self._group_rewards = {env: [(spec.name, resolve(spec)) for spec in specs]
                               for env, specs in settings.group_rewards.items()}

    def on_rollout(self, state: GroupState | None, rollout: RolloutCompleted,
                   now: int | None = None) -> Step:
        now = now_ms() if now is None else now
        if state is not None and _holds(state, rollout.rollout_id):
            return Step(state, duplicate=True)
        reason = self._reject_reason(state, rollout)
        if reason or isinstance(state, ClosedGroup):  # (a closed group always has a reason)
            return Step(state, rejected=reason)
        if state is None:
            state = ScorerGroupState(group_id=rollout.group_id, environment=rollout.environment,
                                     algorithm=rollout.algorithm, group_size=rollout.group_size,
                                     first_seen_ms=now)
        held = sorted([*state.rollouts, rollout], key=lambda r: r.sample_index)  # one order, however they arrive
        state = state.model_copy(update={"rollouts": held, "rollout_ids": [r.rollout_id for r in held]})
        if len(state.rollouts) < state.group_size:
            return Step(state, changed=True)
        return self._close(state, now, timed_out=False)

    def on_tick(self, state: GroupState, now: int | None = None) -> Step:
        """Closes a group past its timeout; forgets a closed group past `retain_closed_s`."""
        now = now_ms() if now is None else now
        if isinstance(state, ClosedGroup) or state.closed_at_ms is not None:
            if now - (state.closed_at_ms or 0) >= self.settings.retain_closed_s * 1000:
                return Step(None, changed=True)
            return Step(state)
        if now - state.first_seen_ms >= self.settings.group_timeout_s * 1000:
            return self._close(state, now, timed_out=True)
        return Step(state)

    def overflow(self, state: ScorerGroupState, held_open: int, now: int | None = None) -> Step:
        """Closes an open group early to make room (`max_open_groups`): its rollouts are dropped."""
        now = now_ms() if now is None else now
        closed = state.model_copy(update={"rollouts": [], "closed_at_ms": now})
        events: list[Event] = []
        if state.rollouts:
            events.append(RolloutsDropped(
                rollout_ids=[r.rollout_id for r in state.rollouts], group_id=state.group_id, reason="overflow",
                stage="scorer", detail=f"{held_open} groups were open, the scorer's max_open_groups "
                                       f"{self.settings.max_open_groups}: the oldest was closed to make room"))
        return Step(closed, events, changed=True)

    def _reject_reason(self, state: GroupState | None, rollout: RolloutCompleted) -> str | None:
        if rollout.group_size > self.settings.max_group_size:
            return (f"group_size {rollout.group_size} is over the scorer's max_group_size "
                    f"{self.settings.max_group_size}")
        try:
            advantages.build(rollout.algorithm)
        except UnknownAlgorithmError as exc:
            return str(exc)
        if rollout.error is None:
            if not rollout.rewards:
                return "rollout has no rewards and no error: the environment's reward functions did not run"
            bad = [k for k, v in rollout.rewards.items() if not math.isfinite(v)]
            if bad or not math.isfinite(rollout.reward):
                return f"reward {', '.join(bad) or 'total'} is not a finite number"
        if state is None:
            return None
        if isinstance(state, ClosedGroup) or state.closed_at_ms is not None:
            held = len(state) if isinstance(state, ClosedGroup) else len(state.rollout_ids)
            return (f"group {rollout.group_id} is already closed with {held} rollouts: "
                    f"this one is beyond its declared group_size {state.group_size} or arrived late")
        if (rollout.group_size, rollout.algorithm, rollout.environment) != \
                (state.group_size, state.algorithm, state.environment):
            return (f"rollout declares group_size {rollout.group_size}, algorithm {rollout.algorithm!r}, "
                    f"environment {rollout.environment!r}, but its group has {state.group_size}, "
                    f"{state.algorithm!r}, {state.environment!r}")
        if any(r.sample_index == rollout.sample_index for r in state.rollouts):
            return f"group {state.group_id} already has a rollout with sample_index {rollout.sample_index}"
        return None

    def _close(self, state: ScorerGroupState, now: int, *, timed_out: bool) -> Step:
        closed = state.model_copy(update={"rollouts": [], "closed_at_ms": now})
        usable = [r for r in state.rollouts if r.error is None]
        errored = [r.rollout_id for r in state.rollouts if r.error is not None]
        events: list[Event] = []
        if errored:
            events.append(RolloutsDropped(rollout_ids=errored, group_id=state.group_id, reason="errored",
                                          stage="scorer", detail="the env worker reported an error"))
        if len(usable) < self.settings.min_group_size:
            if usable:
                why = (f"{len(state.rollouts)} of {state.group_size} rollouts arrived within "
                       f"{self.settings.group_timeout_s:g} s" if timed_out else "the others errored")
                events.append(RolloutsDropped(
                    rollout_ids=[r.rollout_id for r in usable], group_id=state.group_id,
                    reason="group_timeout" if timed_out else "invalid", stage="scorer",
                    detail=f"{len(usable)} usable rollouts < min_group_size {self.settings.min_group_size}: {why}"))
            return Step(closed, events, changed=True)
        try:
            events.extend(self._score(state, usable))
        except Exception as exc:  # a teacher or estimator failure: account for every rollout
            events.append(RolloutsDropped(rollout_ids=[r.rollout_id for r in usable], group_id=state.group_id,
                                          reason="invalid", stage="scorer",
                                          detail=f"scoring failed: {type(exc).__name__}: {exc}"))
        return Step(closed, events, changed=True)

    def _score(self, state: ScorerGroupState, usable: list[RolloutCompleted]) -> list[ScoredRollout]:
        bonuses: list[dict[str, float]] = [{} for _ in usable]
        for name, fn in self._group_rewards.get("*", []) + self._group_rewards.get(state.environment, []):
            for i, value in enumerate(fn(usable)):
                bonuses[i][name] = bonuses[i].get(name, 0.0) + value
        finals = [r.reward + sum(b.values()) for r, b in zip(usable, bonuses)]
        estimator = advantages.build(state.algorithm)
        samples = [GroupSample(reward=f, sampler_logprobs=r.completion_logprobs, loss_mask=r.loss_mask,
                               teacher_logprobs=self._teacher_logprobs(r) if estimator.needs_teacher else None)
                   for r, f in zip(usable, finals)]
        values = estimator(samples)
        mean = sum(finals) / len(finals)
        return [ScoredRollout(rollout=r, algorithm=state.algorithm, group_rewards=b, reward=f,
                              group_reward_mean=mean,
                              advantage=None if isinstance(v, list) else v,
                              token_advantages=v if isinstance(v, list) else None)
                for r, b, f, v in zip(usable, bonuses, finals, values)]

    def _teacher_logprobs(self, rollout: RolloutCompleted) -> list[float]:
        if self._teacher is None:
            raise RuntimeError(f"algorithm {rollout.algorithm!r} needs a teacher: set scorer.teacher")
        return self._teacher(rollout.prompt_token_ids, rollout.completion_token_ids)


class GroupOrder:
    """The groups a driver holds open (or closed), oldest first: for `max_open_groups`, the oldest
    open group is closed early to make room (`GroupScorer.overflow`); for `retain_closed_s` and
    `max_closed_groups`, the oldest closed group is forgotten first. Drivers `note` a group's state
    after every change."""

    def __init__(self, *, closed: bool) -> None:
        self.closed = closed
        self._ids: OrderedDict[str, None] = OrderedDict()  # a linked order: taking the oldest is O(1)

    @classmethod
    def of(cls, states: Iterable[tuple[str, GroupState | None]], *, closed: bool) -> GroupOrder:
        """Rebuilt from held states (a restore), ordered by when each group opened (or closed)."""
        found = cls(closed=closed)
        kept = [(g, s) for g, s in states if s is not None and (s.closed_at_ms is not None) == closed]
        for group_id, state in sorted(kept, key=lambda gs: _since(gs[1], closed)):
            found.note(group_id, state)
        return found

    def note(self, group_id: str, state: GroupState | None) -> None:
        if state is not None and (state.closed_at_ms is not None) == self.closed:
            self._ids.setdefault(group_id, None)
        else:
            self._ids.pop(group_id, None)

    def oldest(self) -> str | None:
        return next(iter(self._ids), None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._ids))

    def __len__(self) -> int:
        return len(self._ids)


def _since(state: GroupState, closed: bool) -> int:
    if closed:
        return state.closed_at_ms or 0
    return state.first_seen_ms if isinstance(state, ScorerGroupState) else 0


class Deadlines:
    """When each group next has something for `on_tick` to do (an open group its timeout, a closed
    one its forgetting), so a tick visits only the groups due instead of every group held: the
    scorer holds every group closed within `retain_closed_s`, far more than are due at once.
    Drivers `push` a group's state after every change; a group pushed twice has two entries, and
    the older one, popped early, finds nothing due."""

    def __init__(self, settings: ScorerSettings) -> None:
        self.settings = settings
        self._heap: list[tuple[int, str]] = []

    def push(self, group_id: str, state: GroupState | None) -> None:
        if state is None:
            return
        if state.closed_at_ms is not None:
            due = state.closed_at_ms + math.ceil(self.settings.retain_closed_s * 1000)
        else:
            due = state.first_seen_ms + math.ceil(self.settings.group_timeout_s * 1000)
        heapq.heappush(self._heap, (due, group_id))

    def due(self, now_ms: int) -> list[str]:
        """The groups due by `now_ms` (each once), taken off the schedule."""
        out: dict[str, None] = {}
        while self._heap and self._heap[0][0] <= now_ms:
            out[heapq.heappop(self._heap)[1]] = None
        return list(out)

    def __len__(self) -> int:
        return len(self._heap)


def scoring_span(event: Event) -> AbstractContextManager[None]:
    """Around sending one output event. A `ScoredRollout` is sent inside a `score rollout` span that
    continues its rollout's trace (the `traceparent` the env worker stored in the event) and links to
    the span that closed the group, so each rollout's trace runs on through scoring to the trainer."""
    if not isinstance(event, ScoredRollout) or not telemetry.tracing():
        return nullcontext()
    return _scoring_span(event)


@contextmanager
def _scoring_span(event: ScoredRollout) -> Iterator[None]:
    closing = trace.get_current_span().get_span_context()
    parent = telemetry.context_from_traceparent(event.rollout.traceparent) if event.rollout.traceparent else None
    with telemetry.tracer().start_as_current_span(
            "score rollout", context=parent, links=[trace.Link(closing)] if closing.is_valid else [],
            attributes={"rollwire.rollout_id": event.rollout.rollout_id, "rollwire.group_id": event.rollout.group_id,
                        "rollwire.algorithm": event.algorithm, "rollwire.reward": event.reward}):
        yield
