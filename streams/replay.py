"""Re-scoring a recorded run: the live scorer's state machine over the recorded rollouts.

    <live>.rollouts ──read to the end──▶ GroupScorer (same code as live) ──▶ <shadow>.scored, .drops
    <live>.scored   ──────────────────────────────────────────────────────▶ compare ──▶ report

The clock is the record time: a group times out when the rollouts after it were recorded more
than `group_timeout_s` later, and the groups still open when the log ends are closed as the live
scorer's timer would have closed them. With the recipe unchanged the shadow `scored` events
equal the recorded ones field for field; with another algorithm or other group rewards they show
what would have been trained instead. Nothing is written to the live run's topics.
"""

from __future__ import annotations

import hashlib
import heapq
import importlib.util
import itertools
import math
import numbers
import random
import sqlite3
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from rollwire.core.bus import (
    DeadLetters,
    EventLog,
    EventProducer,
    HeldDeadLetters,
    TopicError,
    catalog_topics,
    read_to_end,
    records_to_end,
)
from rollwire.core.bus.events import Delivery, decoded
from rollwire.core.errors import ConfigError
from rollwire.producers.tasksets import RolloutView
from rollwire.schemas.base import Event
from rollwire.schemas.envelope import Codec
from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout
from rollwire.schemas.scorer import ScorerGroupState
from rollwire.schemas.topics import Topics
from rollwire.streams.scoring import Deadlines, GroupScorer, route

Rewards = tuple[dict[str, float], float]
"""A rollout's reward terms by name, and their weighted sum."""


class RewardModule:
    """A user's Python file of `@reward` functions (`from rollwire.producers.tasksets import reward`),
    judging recorded rollouts again. Its rewards replace the recorded ones: the rollout's reward
    becomes their weighted sum (keep a recorded term by defining it again in the file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():
            raise ConfigError(f"--reward-module {path}: no such file")
        spec = importlib.util.spec_from_file_location(f"rollwire_rewards_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"--reward-module {path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ConfigError(f"--reward-module {path} failed to import: {type(exc).__name__}: {exc}") from None
        self.functions = {fn.__rollwire_reward__[0]: (fn, fn.__rollwire_reward__[1])
                          for fn in vars(module).values() if hasattr(fn, "__rollwire_reward__")}
        if not self.functions:
            raise ConfigError(f"--reward-module {path} holds no reward function: decorate functions of a "
                              "RolloutView with `@reward(\"name\", weight=1.0)` from rollwire.producers.tasksets")

    def judge(self, rollout_id: str, view: RolloutView) -> Rewards:
        rewards = {}
        for name, (fn, _) in self.functions.items():
            try:
                value = fn(view)
            except Exception as exc:
                raise ConfigError(f"reward {name!r} of {self.path} raised {type(exc).__name__}: {exc} "
                                  f"(on rollout {rollout_id}); nothing was written") from None
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ConfigError(f"reward {name!r} of {self.path} returned {value!r} for rollout {rollout_id}, "
                                  "not a finite number; nothing was written")
            rewards[name] = float(value)
        return rewards, sum(self.functions[n][1] * v for n, v in rewards.items())


def judge_again(log: EventLog, live: Topics, module: RewardModule, dead_letters: DeadLetters,
                groups: set[str] | None = None) -> dict[str, Rewards]:
    """New rewards for every usable recorded rollout: its task row from `tasks`, the answer the
    harness returned from `traces`, judged by `module`. Raises `ConfigError` if any is missing."""
    tasks = {d.event.group_id: d.event.task for d in read_to_end(log, [live.tasks], dead_letters)}
    traces = {d.event.rollout_id: (d.event.completion, d.event.finish_reason)  # the answer, not the whole trace
              for d in read_to_end(log, [live.traces], dead_letters)}
    out: dict[str, Rewards] = {}
    for delivery in read_to_end(log, [live.rollouts], dead_letters):
        rollout = delivery.event
        if rollout.error is not None or (groups is not None and rollout.group_id not in groups):
            continue
        if rollout.group_id not in tasks or rollout.rollout_id not in traces:
            missing = "task" if rollout.group_id not in tasks else "trace"
            raise ConfigError(f"the run recorded no {missing} for rollout {rollout.rollout_id}: its rewards cannot be "
                              "computed again (runs from before traces held the answer cannot use --reward-module)")
        completion, finish_reason = traces[rollout.rollout_id]
        view = RolloutView(task=dict(tasks[rollout.group_id]), completion=completion,
                           completion_tokens=sum(rollout.loss_mask), finish_reason=finish_reason)
        out[rollout.rollout_id] = module.judge(rollout.rollout_id, view)
    return out


def rescore(deliveries: Iterable[Delivery], scorer: GroupScorer, *, algorithms: Mapping[str, str] | None = None,
            rewards: Mapping[str, Rewards] | None = None, tick_ms: int = 1000) -> Iterator[Event]:
    """Scored and dropped events from recorded rollouts, in log order, on the recorded clock.
    `algorithms` replaces the advantage algorithm per environment (`"*"`: every environment);
    `rewards` replaces the reward terms and total of rollouts by id."""
    algorithms, rewards = algorithms or {}, rewards or {}
    states: dict[str, ScorerGroupState] = {}
    deadlines = Deadlines(scorer.settings)
    next_tick = None

    def apply(group_id: str, step) -> Iterator[Event]:
        if step.changed:
            if step.state is None:
                states.pop(group_id, None)
            else:
                states[group_id] = step.state
                deadlines.push(group_id, step.state)
        yield from step.events

    def tick(now: int) -> Iterator[Event]:  # times out open groups, forgets closed ones (memory stays bounded)
        for group_id in deadlines.due(now):
            if group_id in states:
                yield from apply(group_id, scorer.on_tick(states[group_id], now=now))

    now = 0
    for delivery in deliveries:
        rollout = delivery.event
        if not isinstance(rollout, RolloutCompleted):
            continue
        override = algorithms.get(rollout.environment, algorithms.get("*"))
        if override:
            rollout = rollout.model_copy(update={"algorithm": override})
        if rollout.rollout_id in rewards:
            terms, total = rewards[rollout.rollout_id]
            rollout = rollout.model_copy(update={"rewards": terms, "reward": total})
        now = max(now, delivery.record.timestamp_ms)
        if next_tick is None or now >= next_tick:
            yield from tick(now)
            next_tick = now + tick_ms
        yield from apply(rollout.group_id, scorer.on_rollout(states.get(rollout.group_id), rollout, now=now))
    yield from tick(now + math.ceil(scorer.settings.group_timeout_s * 1000))


class Stats:
    """Count, mean and spread of a stream of numbers (Welford), and a fixed-size random sample of
    it for histograms: the same memory for a thousand rollouts or a million."""

    def __init__(self, sample_size: int = 20_000, seed: int = 0) -> None:
        self.count, self.mean, self._m2 = 0, 0.0, 0.0
        self.sample: list[float] = []
        self._sample_size, self._rng = sample_size, random.Random(seed)

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)
        if len(self.sample) < self._sample_size:  # reservoir sampling
            self.sample.append(value)
        elif (slot := self._rng.randrange(self.count)) < self._sample_size:
            self.sample[slot] = value

    @property
    def spread(self) -> float:
        """Population standard deviation."""
        return math.sqrt(self._m2 / self.count) if self.count > 1 else 0.0

    def describe(self) -> str:
        if not self.count:
            return "–"
        return f"{round(self.mean, 3) + 0.0:+.3f} ± {self.spread:.3f}"  # + 0.0: no "-0.000"


@dataclass
class EnvironmentChange:
    """Before and after, for one environment's rollouts scored in both."""

    rollouts: int = 0
    rewards_before: Stats = field(default_factory=Stats)
    rewards_after: Stats = field(default_factory=Stats)
    advantages_before: Stats = field(default_factory=lambda: Stats(seed=1))
    advantages_after: Stats = field(default_factory=lambda: Stats(seed=1))  # the same seed: the same rollouts sampled
    sign_flips: int = 0


@dataclass
class Comparison:
    """The recorded scored events against the replayed ones, by rollout id. Counts, statistics and
    the largest changes only: its size does not grow with the run."""

    identical: int = 0
    """Rollouts whose replayed event equals the recorded one in every field."""
    changed: int = 0
    """Rollouts scored in both with another result."""
    largest: list[tuple[str, float, float]] = field(default_factory=list)
    """(rollout id, advantage before, after) of the `LARGEST_KEPT` largest advantage changes."""
    only_recorded: int = 0
    only_replayed: int = 0
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """A few rollout or group ids of each kind: `only_recorded`, `only_replayed`, `zero_signal`."""
    environments: dict[str, EnvironmentChange] = field(default_factory=lambda: defaultdict(EnvironmentChange))
    zero_signal_groups: int = 0
    """Groups whose advantages were not all zero as recorded and are after the replay."""

    @property
    def unchanged(self) -> bool:
        return not (self.changed or self.only_recorded or self.only_replayed)


LARGEST_KEPT = 50
"""Largest advantage changes a comparison keeps (the report shows the first ten)."""
EXAMPLES_KEPT = 5


class Comparer:
    """Compares replayed scored events, as the replay writes them, with the recorded ones. The
    recorded summaries wait in a temporary SQLite file keyed by rollout id, so memory stays the
    same however long the run was. Replayed events arrive a whole group at a time; each group is
    looked up with one query."""

    def __init__(self, recorded: Iterable[tuple[str, Summary]], folder: Path) -> None:
        self.result = Comparison()
        self._db = sqlite3.connect(folder / "recorded.sqlite", isolation_level=None)
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE recorded (rollout_id TEXT PRIMARY KEY, environment TEXT, group_id TEXT, "
                         "reward REAL, advantage REAL, digest BLOB)")
        self._db.execute("CREATE TABLE matched (rollout_id TEXT)")  # appended to, indexed once at the end
        self._db.execute("BEGIN")
        rows = ((rid, s.environment, s.group_id, s.reward, s.advantage, s.digest) for rid, s in recorded)
        while chunk := list(itertools.islice(rows, 10_000)):  # a group scored twice counts once: its last scoring
            self._db.executemany("INSERT OR REPLACE INTO recorded (rollout_id, environment, group_id, reward, "
                                 "advantage, digest) VALUES (?, ?, ?, ?, ?, ?)", chunk)
        self._db.execute("COMMIT")
        self._db.execute("BEGIN")  # one transaction for the matching: a commit per group costs ~90 us
        self._group: list[tuple[str, Summary]] = []
        self._largest: list[tuple[float, str, float, float]] = []  # a min-heap on |change|

    def add(self, rollout_id: str, new: Summary) -> None:
        """One replayed scored event."""
        if self._group and self._group[-1][1].group_id != new.group_id:
            self._compare_group()
        self._group.append((rollout_id, new))

    def _compare_group(self) -> None:
        group, self._group = self._group, []
        ids = [rid for rid, _ in group]
        found = {row[0]: row[1:] for row in self._db.execute(
            f"SELECT rollout_id, environment, reward, advantage, digest FROM recorded "
            f"WHERE rollout_id IN ({', '.join('?' * len(ids))})", ids)}
        self._db.executemany("INSERT INTO matched VALUES (?)", [(rid,) for rid in found])
        result = self.result
        before, after = [], []
        for rollout_id, new in group:
            if rollout_id not in found:
                result.only_replayed += 1
                self._example("only_replayed", rollout_id)
                continue
            environment, reward, a_old, digest = found[rollout_id]
            a_new = new.advantage
            env = result.environments[environment]
            env.rollouts += 1
            env.rewards_before.add(reward)
            env.rewards_after.add(new.reward)
            env.advantages_before.add(a_old)
            env.advantages_after.add(a_new)
            env.sign_flips += (a_old > 0 > a_new) or (a_old < 0 < a_new)
            before.append(a_old)
            after.append(a_new)
            if digest == new.digest:
                result.identical += 1
                continue
            result.changed += 1
            entry = (abs(a_new - a_old), rollout_id, a_old, a_new)
            if len(self._largest) < LARGEST_KEPT:
                heapq.heappush(self._largest, entry)
            else:
                heapq.heappushpop(self._largest, entry)
        if after and all(v == 0 for v in after) and any(v != 0 for v in before):
            result.zero_signal_groups += 1
            self._example("zero_signal", group[0][1].group_id)

    def _example(self, kind: str, rollout_id: str) -> None:
        if len(self.result.examples[kind]) < EXAMPLES_KEPT:
            self.result.examples[kind].append(rollout_id)

    def finish(self) -> Comparison:
        """The comparison; recorded events no replayed one matched count as `only_recorded`."""
        if self._group:
            self._compare_group()
        result = self.result
        self._db.execute("COMMIT")
        self._db.execute("CREATE INDEX matched_ids ON matched (rollout_id)")
        unmatched = "FROM recorded WHERE rollout_id NOT IN (SELECT rollout_id FROM matched)"
        result.only_recorded = self._db.execute(f"SELECT COUNT(*) {unmatched}").fetchone()[0]
        result.examples["only_recorded"] = [r for (r,) in self._db.execute(
            f"SELECT rollout_id {unmatched} ORDER BY rollout_id LIMIT ?", (EXAMPLES_KEPT,))]
        result.largest = [(rid, old, new) for _, rid, old, new in sorted(self._largest, reverse=True)]
        self._db.close()
        return result


def _advantage(event: ScoredRollout) -> float:
    if event.advantage is not None:
        return event.advantage
    values = event.token_advantages or []
    return sum(values) / len(values) if values else 0.0


@dataclass(frozen=True)
class Summary:
    """What the comparison keeps of one scored event (a few dozen bytes, not the event)."""

    environment: str
    group_id: str
    reward: float
    advantage: float
    digest: bytes
    """Of every field of the event: equal digests, equal events."""

    @classmethod
    def of(cls, event: ScoredRollout) -> Summary:
        return cls.of_payload(event.model_dump(mode="python"))

    @classmethod
    def of_payload(cls, payload: dict) -> Summary:
        """From the payload map an envelope carries (what `Codec.encode` packs), so recorded events
        are compared without validating each one again."""
        advantage = payload["advantage"]
        if advantage is None:
            values = payload["token_advantages"] or []
            advantage = sum(values) / len(values) if values else 0.0
        digest = hashlib.blake2b(msgpack.packb(payload, use_bin_type=True), digest_size=16).digest()
        return cls(payload["rollout"]["environment"], payload["rollout"]["group_id"], payload["reward"], advantage,
                   digest)


def recorded_summaries(log: EventLog, topic: str, dead_letters: DeadLetters) -> Iterator[tuple[str, Summary]]:
    """`(rollout id, Summary)` of every scored event on `topic`, read as msgpack: no pydantic
    validation, which is most of what decoding costs (envelopes of another schema version are
    decoded in full, so their upgrades apply)."""
    codec = Codec()
    for record in records_to_end(log, [topic]):
        if record.value is None:
            continue
        try:
            raw = msgpack.unpackb(record.value, raw=False)
            if raw.get("type") == "rollout.scored" and raw.get("schema_version") == ScoredRollout.SCHEMA_VERSION:
                payload = raw["payload"]
                yield payload["rollout"]["rollout_id"], Summary.of_payload(payload)
                continue
        except Exception:  # not our envelope: the full decode below says why
            pass
        delivery = decoded(record, codec, dead_letters)
        if delivery is not None and isinstance(delivery.event, ScoredRollout):
            yield delivery.event.rollout.rollout_id, Summary.of(delivery.event)


def compare(recorded: Iterable[ScoredRollout | tuple[str, Summary]],
            replayed: Iterable[ScoredRollout | tuple[str, Summary]]) -> Comparison:
    """Recorded against replayed scored events (or `(rollout id, Summary)` pairs), by rollout id;
    a group scored twice as recorded (at-least-once) counts once, its last scoring."""
    def pairs(items: Iterable[ScoredRollout | tuple[str, Summary]]) -> Iterator[tuple[str, Summary]]:
        return (item if isinstance(item, tuple) else (item.rollout.rollout_id, Summary.of(item)) for item in items)

    with tempfile.TemporaryDirectory(prefix="rollwire-replay-") as folder:
        comparer = Comparer(pairs(recorded), Path(folder))
        for rollout_id, summary in pairs(replayed):
            comparer.add(rollout_id, summary)
        return comparer.finish()


def report_markdown(comparison: Comparison, *, run: str, shadow: str, what: str, largest: int = 10) -> str:
    """The report `rollwire replay score` prints and writes."""
    zero = comparison.examples.get("zero_signal", [])
    lines = [f"# Replay of `{run}` into `{shadow}`", "", what, "",
             f"- rollouts scored in both: {comparison.identical + comparison.changed}, "
             f"identical: {comparison.identical}, changed: {comparison.changed}",
             f"- scored only as recorded: {comparison.only_recorded}; only in the replay: {comparison.only_replayed}",
             f"- groups that lost all signal (every advantage now 0): {comparison.zero_signal_groups}"
             + (f" — {', '.join(zero)}" if zero else ""),
             "", "| environment | rollouts | reward before | reward after | advantage before | advantage after "
             "| sign flips |", "|---|---|---|---|---|---|---|"]
    for name, env in sorted(comparison.environments.items()):
        lines.append(f"| {name} | {env.rollouts} | {env.rewards_before.describe()} | {env.rewards_after.describe()} | "
                     f"{env.advantages_before.describe()} | {env.advantages_after.describe()} | {env.sign_flips} |")
    if comparison.changed:
        lines += ["", f"Largest advantage changes (of {comparison.changed}):", "",
                  "| rollout | advantage before | after |", "|---|---|---|"]
        for rollout_id, old, new in comparison.largest[:largest]:
            lines.append(f"| {rollout_id} | {old:+.4f} | {new:+.4f} |")
    return "\n".join(lines) + "\n"


def plot_advantages(comparison: Comparison, path: Path) -> Path:
    """Histograms of the advantages before and after, one panel per environment."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    envs = sorted(comparison.environments.items()) or [("(none)", EnvironmentChange())]
    figure, axes = plt.subplots(len(envs), 1, figsize=(7, 2.8 * len(envs) + 0.4), dpi=110, squeeze=False)
    for axis, (name, env) in zip(axes[:, 0], envs):
        values = env.advantages_before.sample + env.advantages_after.sample
        bins: int | list[float] = 30
        if values and min(values) < max(values):
            low, high = min(values), max(values)
            bins = [low + (high - low) * i / 30 for i in range(31)]
        axis.hist(env.advantages_before.sample, bins=bins, alpha=0.5, label="recorded")
        axis.hist(env.advantages_after.sample, bins=bins, alpha=0.5, label="replayed")
        axis.set_title(f"{name}: advantages ({env.sign_flips} sign flips)")
        axis.legend(fontsize="small")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def _records_on(log: EventLog, topic: str) -> int:
    try:
        return sum(log.end_offsets(topic).values())
    except TopicError:
        return 0


def _refuse_target(log: EventLog, live: Topics, shadow: Topics) -> None:
    if shadow.prefix == live.prefix:
        raise ConfigError(f"the shadow prefix must differ from the run's own ({live.prefix!r}): "
                          "replay never writes into a live run's topics; pick another --into")
    if not _records_on(log, live.rollouts):
        raise ConfigError(f"no rollouts are recorded under the prefix {live.prefix!r} on this log: check the run "
                          "directory, or --prefix and the bus options")
    if _records_on(log, shadow.scored):
        raise ConfigError(f"{shadow.scored} already holds events from an earlier replay: pick another --into")


@dataclass(frozen=True)
class Range:
    """Which recorded groups a replay takes: those whose first rollout was recorded between
    `since_ms` and `until_ms`, or at an offset of its `rollouts` partition between `from_offset`
    and `to_offset`, and/or those a trainer step from `first_step` to `last_step` used. A group
    is taken whole or not at all, so no group is cut in two."""

    since_ms: int | None = None
    until_ms: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None

    @property
    def by_time(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None

    @property
    def by_offset(self) -> bool:
        return self.from_offset is not None or self.to_offset is not None

    @property
    def by_step(self) -> bool:
        return self.first_step is not None or self.last_step is not None

    def describe(self) -> str:
        parts = []
        if self.by_step:
            parts.append(f"trainer steps {self.first_step or 0}..{'' if self.last_step is None else self.last_step}")
        if self.by_time:
            parts.append(f"record time {self.since_ms or 0}..{'' if self.until_ms is None else self.until_ms} ms")
        if self.by_offset:
            parts.append(f"offsets {self.from_offset or 0}..{'' if self.to_offset is None else self.to_offset} "
                         "of each rollouts partition")
        return " and ".join(parts) or "the whole run"


def groups_in(log: EventLog, live: Topics, span: Range) -> set[str] | None:
    """The group ids `span` takes (None: every group). Raises `ConfigError` naming the run's own
    extent when it takes none."""
    if not (span.by_time or span.by_step or span.by_offset):
        return None
    wanted: set[str] | None = None
    if span.by_step:
        held = HeldDeadLetters("replay")
        steps = [d.event for d in read_to_end(log, [live.train], held)]
        lo, hi = span.first_step or 0, span.last_step if span.last_step is not None else math.inf
        wanted = {rid for s in steps if lo <= s.step <= hi for rid in s.rollout_ids}
    first_seen: dict[str, tuple[int, int]] = {}  # (record time, offset) of a group's first rollout
    chosen: set[str] = set()
    for record in records_to_end(log, [live.rollouts]):
        try:
            payload = msgpack.unpackb(record.value, raw=False)["payload"]
            group_id, rollout_id = payload["group_id"], payload["rollout_id"]
        except Exception:  # not a rollout: the replay itself dead-letters it
            continue
        first_ms, first_offset = first_seen.setdefault(group_id, (record.timestamp_ms, record.offset))
        if span.by_time and not ((span.since_ms or 0) <= first_ms
                                 <= (span.until_ms if span.until_ms is not None else math.inf)):
            continue
        if span.by_offset and not ((span.from_offset or 0) <= first_offset
                                   <= (span.to_offset if span.to_offset is not None else math.inf)):
            continue
        if wanted is None or rollout_id in wanted:
            chosen.add(group_id)
    if not chosen:
        times, offsets = [t for t, _ in first_seen.values()], [o for _, o in first_seen.values()]
        extent = (f"its rollouts were recorded from {min(times)} to {max(times)} ms, at offsets up to "
                  f"{max(offsets)}" if first_seen else "it recorded no rollouts")
        if span.by_step:
            extent += f"; its trainer steps run {min((s.step for s in steps), default=0)}.." \
                      f"{max((s.step for s in steps), default=0)}"
        raise ConfigError(f"no recorded group falls in {span.describe()}: {extent}")
    return chosen


def score_into(log: EventLog, live: Topics, shadow: Topics, scorer: GroupScorer, *,
               algorithms: Mapping[str, str] | None = None, reward_module: RewardModule | None = None,
               span: Range = Range(), progress: Callable[[int], None] = lambda n: None) -> Comparison:
    """Re-scores the run recorded under `live` into the topics of `shadow` on the same log, and
    compares the result with what the run recorded. Raises `ConfigError` before writing anything
    when the target is the live run, already used, the run has no rollouts (in `span`), or the
    reward module fails on any of them."""
    _refuse_target(log, live, shadow)
    groups = groups_in(log, live, span)
    held = HeldDeadLetters("replay")
    rewards = judge_again(log, live, reward_module, held, groups) if reward_module is not None else None
    log.create_topics(catalog_topics(shadow))
    producer = EventProducer(log.producer(), shadow, name="replay")
    dead_letters = DeadLetters(producer, "replay")  # bad recorded records are reported in the shadow's deadletter
    held.release(dead_letters)
    read = 0

    def counted(deliveries: Iterable[Delivery]) -> Iterator[Delivery]:
        nonlocal read
        for delivery in deliveries:
            read += 1
            if read % 1000 == 0:
                progress(read)
            if groups is None or getattr(delivery.event, "group_id", None) in groups:
                yield delivery

    try:
        with tempfile.TemporaryDirectory(prefix="rollwire-replay-") as folder:
            comparer = Comparer(((rid, s) for rid, s in recorded_summaries(log, live.scored, dead_letters)
                                 if groups is None or s.group_id in groups), Path(folder))
            for event in rescore(counted(read_to_end(log, [live.rollouts], dead_letters)), scorer,
                                 algorithms=algorithms, rewards=rewards):
                group_id = (event.rollout.group_id if isinstance(event, ScoredRollout)
                            else getattr(event, "group_id", None))
                producer.send(shadow.name(route(event)), event, key=group_id)
                if isinstance(event, ScoredRollout):
                    comparer.add(event.rollout.rollout_id, Summary.of(event))
            progress(read)
            producer.flush()
            return comparer.finish()
    finally:
        producer.close()
