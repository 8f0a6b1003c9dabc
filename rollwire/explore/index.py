"""What the run explorer knows of a run: a compact index of its events, followed as the run goes.

    rollouts, traces, scored, drops, train, fleet, weights, serving ──follow()──▶ RunIndex
        steps      one row per trainer step (the curves, and what each step trained)
        rollouts   one `RolloutRow` per rollout: where its records are, reward, advantage, fate
        drops      counts by reason over time
        fleet      each replica's last status, its reloads, the serving decisions

The index holds summaries and record positions, never events: a rollout's tokens, trace and
scores are read back from their records when one is opened (`RolloutDetail`, `read_at`). Every
collection is bounded (`max_rollouts`, `max_points`): past a bound the oldest entries are
forgotten and counted (`rollwire.core.bounds`), so the explorer can follow a run of days.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rollwire.core import bounds
from rollwire.core.bus import AtOffsets, Beginning, DeadLetters, EventConsumer, EventLog
from rollwire.core.bus.base import Record
from rollwire.core.metrics import LagProbe
from rollwire.schemas.deadletter import DeadLetterStage
from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout, TraceRecorded
from rollwire.schemas.topics import Topics
from rollwire.schemas.training import RolloutsDropped, TrainStepCompleted
from rollwire.schemas.weights import ReplicaStatus, ServingDecision, WeightsPublished

FOLLOWED = ("rollouts", "traces", "scored", "drops", "train", "fleet", "weights", "serving")
"""The topics the index follows (short names)."""
LAG_EVERY_S = 5.0


class CountedDeadLetters(DeadLetters):
    """Records the explorer cannot decode: counted, the last few kept to show, nothing written."""

    def __init__(self, keep: int = 20) -> None:
        self.count = 0
        self.last: collections.deque[str] = collections.deque(maxlen=keep)

    def send(self, record: Record, error: BaseException | str, *, stage: DeadLetterStage = "process") -> None:
        self.count += 1
        self.last.append(f"{record.topic}[{record.partition}]@{record.offset}: {error}")

    def flush(self) -> None:
        pass


@dataclass(slots=True)
class RolloutRow:
    """What the index keeps of one rollout (~500 B with its id, measured: `tests/unit/test_explore.py`)."""

    rollout_id: str
    group_id: str
    environment: str
    sample_index: int
    reward: float
    version_min: int | None
    version_max: int | None
    tokens: int
    """Completion tokens."""
    time_ms: int
    at: int
    """Where its record is on `rollouts` (`position`: partition and offset in one int)."""
    error: str | None = None
    advantage: float | None = None
    final_reward: float | None = None
    """With group rewards, as scored."""
    scored_at: int | None = None
    trace_at: int | None = None
    fate: str = "in flight"
    """`in flight`, `trained` or `dropped`."""
    step: int | None = None
    reason: str | None = None
    detail: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__ if name not in ("at", "scored_at", "trace_at")}


@dataclass
class Query:
    """A page of rollouts, filtered: every given field must match."""

    environment: str | None = None
    fate: str | None = None
    reason: str | None = None
    step: int | None = None
    version: int | None = None
    group: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    text: str | None = None
    """A substring of the rollout or group id."""
    offset: int = 0
    limit: int = 50

    def matches(self, row: RolloutRow) -> bool:
        return ((self.environment is None or row.environment == self.environment)
                and (self.fate is None or row.fate == self.fate)
                and (self.reason is None or row.reason == self.reason)
                and (self.step is None or row.step == self.step)
                and (self.version is None or (row.version_min is not None and row.version_max is not None
                                              and row.version_min <= self.version <= row.version_max))
                and (self.group is None or row.group_id == self.group)
                and (self.min_reward is None or row.reward >= self.min_reward)
                and (self.max_reward is None or row.reward <= self.max_reward)
                and (self.text is None or self.text in row.rollout_id or self.text in row.group_id))


def _ends(log: EventLog, names: list[str]) -> dict[tuple[str, int], int]:
    """Where each partition of `names` ends now (topics not created yet: nothing to catch up on)."""
    ends: dict[tuple[str, int], int] = {}
    for name in names:
        try:
            ends.update({(name, p): end for p, end in log.end_offsets(name).items() if end > 0})
        except Exception:  # a topic the run has not created yet, or a log away: read what comes
            continue
    return ends


class RunIndex:
    """Follows a run's topics from their beginning; `follow()` reads what is new. Thread-safe: one
    thread follows, request handlers read under `lock`."""

    def __init__(self, log: EventLog, topics: Topics, *, max_rollouts: int = 200_000, max_points: int = 20_000) -> None:
        self.log, self.topics = log, topics
        self.max_rollouts = max_rollouts
        self.lock = threading.Lock()
        self.unreadable = CountedDeadLetters()
        names = [topics.name(t) for t in FOLLOWED]
        self._reader = log.reader(names, Beginning())
        self._consumer = EventConsumer(self._reader, self.unreadable)
        self._catch_up_to = _ends(log, names)
        self.behind = sum(self._catch_up_to.values())
        """Records between where the index has read and where the log ended when it opened."""
        self.caught_up = not self.behind
        """True once the index read what was on the log when it opened (or found nothing more to read)."""
        self.rollouts: collections.OrderedDict[str, RolloutRow] = collections.OrderedDict()
        self.groups: dict[str, list[str]] = {}
        self._early: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        """Facts read before their rollout's record (at most `max_rollouts` rollouts' worth)."""
        self.forgotten = 0
        self.steps = bounds.Points(max_points)
        self.step_rows: dict[int, dict[str, Any]] = {}
        """Each step's row by step number (the latest `max_points` steps)."""
        self.env_rewards: dict[int, dict[str, tuple[float, int]]] = {}
        """Per step, per environment: the reward (with group rewards) summed over its trained rollouts,
        and their count."""
        self.drops: collections.Counter[str] = collections.Counter()
        self.drop_points = bounds.Points(max_points)
        self.replicas: dict[str, dict[str, Any]] = {}
        self.reloads = bounds.Points(max_points)
        self.served_at: dict[int, dict[str, int]] = {}
        """Per weight version: when each replica first served it (epoch ms)."""
        self.versions = bounds.Points(max_points)
        self.decisions: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)
        self.lag = bounds.Points(max_points)
        self._probe = LagProbe(log, [(topics.group("env-worker"), topics.tasks),
                                     (topics.group("scorer"), topics.rollouts),
                                     (topics.group("joiner"), topics.served)])
        self._lag_at = 0.0
        self.records = 0
        self.updated_ms = 0

    # -- following ----------------------------------------------------------------------------

    def follow(self, timeout_s: float = 0.5, max_records: int = 2000) -> int:
        """Reads what is new (up to `max_records`) into the index; returns the records read."""
        deliveries = self._consumer.poll_batch(max_records, timeout_s)
        with self.lock:
            for delivery in deliveries:
                self._apply(delivery.event, delivery.record)
            self.records += len(deliveries)
            if deliveries:  # when the run last wrote, not when the explorer read it
                self.updated_ms = max(self.updated_ms, max(d.record.timestamp_ms for d in deliveries))
            if not self.caught_up:
                consumed = self._reader.consumed_offsets()
                self.behind = sum(max(0, end - consumed.get(tp, 0)) for tp, end in self._catch_up_to.items())
                self.caught_up = not self.behind or not deliveries
        if time.monotonic() - self._lag_at >= LAG_EVERY_S:
            self._lag_at = time.monotonic()
            self._sample_lag()
        return len(deliveries)

    def _sample_lag(self) -> None:
        try:
            read = self._probe.read()
        except Exception:  # a log away: the lag is unknown for now, not zero
            return
        with self.lock:
            self.lag.add({"time_ms": int(time.time() * 1000), **{f"{group}": value for (group, _), value in read.items()}})

    def _apply(self, event: Any, record: Record) -> None:
        if isinstance(event, RolloutCompleted):
            self._add_rollout(event, record)
        elif isinstance(event, ScoredRollout):
            self._note(event.rollout.rollout_id, advantage=_advantage(event), final_reward=event.reward,
                       scored_at=position(record))
        elif isinstance(event, TraceRecorded):
            self._note(event.rollout_id, trace_at=position(record))
        elif isinstance(event, RolloutsDropped):
            self._drop(event, record)
        elif isinstance(event, TrainStepCompleted):
            self._step(event)
        elif isinstance(event, ReplicaStatus):
            self._status(event, record)
        elif isinstance(event, WeightsPublished):
            self.versions.add({"version": event.version, "time_ms": record.timestamp_ms,
                               "size_bytes": event.size_bytes, "full_size_bytes": event.full_size_bytes,
                               "kind": "delta" if event.base_version is not None else "snapshot"})
        elif isinstance(event, ServingDecision):
            self.decisions.append({"time_ms": record.timestamp_ms, "reason": event.reason,
                                   "stable": event.stable.version,
                                   "canary": event.canary.version if event.canary else None,
                                   "canary_share": event.canary_share, "by": event.decided_by, "note": event.note})

    def _add_rollout(self, event: RolloutCompleted, record: Record) -> None:
        versions = [span.version for span in event.weight_versions]
        row = RolloutRow(  # a group's and an environment's name held once, however many rollouts name them
            rollout_id=event.rollout_id, group_id=sys.intern(event.group_id), environment=sys.intern(event.environment),
            sample_index=event.sample_index, reward=event.reward, version_min=min(versions, default=None),
            version_max=max(versions, default=None), tokens=len(event.completion_token_ids),
            time_ms=record.timestamp_ms, at=position(record),
            error=event.error.kind if event.error is not None else None)
        if event.rollout_id in self.rollouts:  # a redelivery: the first record stands
            return
        early = self._early.pop(event.rollout_id, {})
        for name, value in early.items():
            setattr(row, name, value)
        if early.get("fate") == "trained":
            self._count_trained(row)
        self.rollouts[event.rollout_id] = row
        self.groups.setdefault(event.group_id, []).append(event.rollout_id)
        while len(self.rollouts) > self.max_rollouts:
            _, old = self.rollouts.popitem(last=False)
            members = self.groups.get(old.group_id, [])
            if old.rollout_id in members:
                members.remove(old.rollout_id)
            if not members:
                self.groups.pop(old.group_id, None)
            self.forgotten += 1
            bounds.noted("explore.max_rollouts", what=": the explorer lists the newest rollouts only")

    def _note(self, rollout_id: str, **facts: Any) -> None:
        """Facts about a rollout: on its row, or kept until its record is read (topics are read in
        no order among themselves: a step can be read before the rollouts it trained)."""
        row = self.rollouts.get(rollout_id)
        if row is not None:
            if row.fate == "trained" and row.final_reward is None and facts.get("final_reward") is not None:
                self._count_trained(row, instead_of=row.reward, reward=facts["final_reward"])  # scored read late
            for name, value in facts.items():
                setattr(row, name, value)
            if facts.get("fate") == "trained":
                self._count_trained(row)
            return
        self._early.setdefault(rollout_id, {}).update(facts)
        while len(self._early) > self.max_rollouts:
            self._early.popitem(last=False)

    def _count_trained(self, row: RolloutRow, *, instead_of: float | None = None, reward: float | None = None) -> None:
        """A rollout trained in step `row.step`: its environment's reward in that step, as the
        trainer's step mean counts it (with group rewards: `final_reward`). `instead_of`: a reward
        counted before, replaced by `reward` (its scored record was read after the step)."""
        if reward is None:
            reward = row.final_reward if row.final_reward is not None else row.reward
        per_env = self.env_rewards.setdefault(row.step or 0, {})
        total, count = per_env.get(row.environment, (0.0, 0))
        if instead_of is None:
            per_env[row.environment] = (total + reward, count + 1)
        else:
            per_env[row.environment] = (total + reward - instead_of, count)
        while len(self.env_rewards) > self.steps.limit:
            self.env_rewards.pop(min(self.env_rewards))

    def environments_of(self, step: int) -> dict[str, dict[str, float]]:
        """Each environment's mean reward and rollouts trained in `step` (those the index has read)."""
        return {env: {"reward": total / count, "rollouts": count}
                for env, (total, count) in sorted(self.env_rewards.get(step, {}).items())}

    def _drop(self, event: RolloutsDropped, record: Record) -> None:
        for rollout_id in event.rollout_ids:
            self._note(rollout_id, fate="dropped", reason=sys.intern(event.reason), detail=event.detail)
        self.drops[sys.intern(event.reason)] += len(event.rollout_ids)
        self.drop_points.add({"time_ms": record.timestamp_ms, **self.drops})

    def _step(self, event: TrainStepCompleted) -> None:
        for rollout_id in event.rollout_ids:
            self._note(rollout_id, fate="trained", step=event.step)
        previous = self.steps.rows[-1] if self.steps.rows else None
        seconds = (event.completed_at_ms - previous["time_ms"]) / 1000 if previous else None
        staleness = event.staleness
        row: dict[str, Any] = {
            "step": event.step, "version": event.policy_version, "time_ms": event.completed_at_ms,
            "reward": event.reward_mean, "reward_terms": dict(event.rewards_mean), "loss": event.loss,
            "grad_norm": event.grad_norm, "tokens_per_s": event.tokens_per_s, "wait_s": event.wait_s,
            "samples": dict(event.samples), "rollouts": len(event.rollout_ids), "drops": dict(event.drops),
            "samples_per_s": len(event.rollout_ids) / seconds if seconds else None,
            "staleness_mean": staleness.mean if staleness else None, "staleness_max": staleness.max if staleness else None,
            "loss_metrics": dict(event.loss_metrics), "skipped": event.skipped_reason}
        self.steps.add(row)
        self.step_rows[event.step] = row
        while len(self.step_rows) > self.steps.limit:
            self.step_rows.pop(next(iter(self.step_rows)))

    def _status(self, event: ReplicaStatus, record: Record) -> None:
        self.replicas[event.replica_id] = {
            "replica": event.replica_id, "state": event.state, "serving": event.serving_version,
            "requested": event.requested_version, "reason": event.reason, "url": event.url,
            "transfer": event.transfer, "time_ms": record.timestamp_ms}
        if event.state == "serving" and event.serving_version is not None:
            first = self.served_at.setdefault(event.serving_version, {})
            if event.replica_id not in first:
                first[event.replica_id] = record.timestamp_ms
                self.reloads.add({"time_ms": record.timestamp_ms, "replica": event.replica_id,
                                  "version": event.serving_version, "pause_s": event.swap_s,
                                  "drain_s": event.drain_s, "apply_s": event.apply_s,
                                  "download_s": event.download_s, "transfer": event.transfer})
            while len(self.served_at) > self.steps.limit:
                self.served_at.pop(min(self.served_at))

    # -- reading ------------------------------------------------------------------------------

    def page(self, query: Query) -> tuple[int, list[dict[str, Any]]]:
        """(rollouts matching, the page of them), newest first."""
        with self.lock:
            found = [row for row in reversed(self.rollouts.values()) if query.matches(row)]
        return len(found), [row.as_json() for row in found[query.offset:query.offset + query.limit]]

    def environments(self) -> list[str]:
        with self.lock:
            return sorted({row.environment for row in self.rollouts.values()})

    def group(self, group_id: str) -> list[dict[str, Any]]:
        with self.lock:
            rows = [self.rollouts[r] for r in self.groups.get(group_id, []) if r in self.rollouts]
        return [row.as_json() for row in sorted(rows, key=lambda r: r.sample_index)]

    def row(self, rollout_id: str) -> RolloutRow | None:
        with self.lock:
            return self.rollouts.get(rollout_id)

    def read_at(self, short: str, at: int) -> Any:
        """The event of one record: `short` topic, at `position`."""
        at_pair = (at >> OFFSET_BITS, at & ((1 << OFFSET_BITS) - 1))
        topic = self.topics.name(short)
        offsets = {(topic, p): end for p, end in self.log.end_offsets(topic).items()}
        offsets[(topic, at_pair[0])] = at_pair[1]
        consumer = EventConsumer(self.log.reader([topic], AtOffsets(offsets)), self.unreadable)
        try:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                for delivery in consumer.poll_batch(1, 1.0):
                    if (delivery.record.partition, delivery.record.offset) == at_pair:
                        return delivery.event
            return None
        finally:
            consumer.close()


OFFSET_BITS = 44


def position(record: Record) -> int:
    """A record's partition and offset as one int (a tuple of two costs ~110 B, this ~32)."""
    return (record.partition << OFFSET_BITS) | record.offset


def _advantage(event: ScoredRollout) -> float | None:
    if event.advantage is not None:
        return event.advantage
    values = event.token_advantages or []
    return sum(values) / len(values) if values else None


def tokens_of(rollout: RolloutCompleted, scored: ScoredRollout | None, pieces: Iterable[str] | None) -> list[dict[str, Any]]:
    """Each completion token: its text, whether it is trained (mask), the weight version that sampled
    it, its sampler logprob and, for token-level estimators, its advantage."""
    ids = rollout.completion_token_ids
    texts = list(pieces) if pieces is not None else [f"{i} " for i in ids]  # ids apart when nothing decodes them
    versions: list[int | None] = [None] * len(ids)
    for span in rollout.weight_versions:
        for i in range(span.start, min(span.end, len(ids))):
            versions[i] = span.version
    token_advantages = scored.token_advantages if scored is not None else None
    return [{"id": ids[i], "text": texts[i], "mask": rollout.loss_mask[i] if i < len(rollout.loss_mask) else 0,
             "version": versions[i],
             "logprob": rollout.completion_logprobs[i] if i < len(rollout.completion_logprobs) else None,
             "advantage": token_advantages[i] if token_advantages and i < len(token_advantages) else None}
            for i in range(len(ids))]
