"""The dispatcher: hands out tasks from a weighted mix of environments, only as fast as the
trainer's off-policy budget allows.

    reads:  <prefix>.train (steps: rollouts trained), <prefix>.drops (rollouts dropped),
            <prefix>.sampling (rollouts that made their first generation request),
            <prefix>.weights (versions published), <prefix>.fleet (which version each replica serves),
            <prefix>.deadletter (rollouts and tasks a component refused: counted back)
    writes: <prefix>.tasks (TaskAssigned, key: group id)

Pacing. A rollout issued now is trained after every rollout already in flight; with
`batch_rollouts` per step, it waits about in_flight / batch_rollouts steps, and its lag is that
many versions. Keeping

    in_flight + group_size <= (max_off_policy + 1) * batch_rollouts

before issuing a group keeps the lag within `max_off_policy` (the trainer still drops what
slips past it, e.g. after a slow group). `max_off_policy = 0` makes the loop synchronous: one
step's worth of work at a time. In flight = rollouts issued - rollouts trained - rollouts dropped.
Rollouts dead-lettered downstream count as accounted too (a dead task as its whole group).

A rollout's tokens take their version when they are sampled, not when the task is issued: one
still waiting on its environment (or on a free env-worker slot) cannot go stale yet. So the budget
counts a rollout from its first generation request (`SamplingStarted`, sent by its env worker).
A new group must fit as if it sampled at once, and of the rollouts already waiting, only those
past an allowance of `waiting_rollouts` count:

    sampling + max(group_size, waiting + group_size - waiting_rollouts) <= (max_off_policy + 1) * batch_rollouts

With `waiting_rollouts = 0` (the synchronous loop's default) this is the rule above; with no
environment latency nothing waits and it is that rule too. Waiting rollouts that all start at once
can push the sampling ones past the budget by up to the allowance; the trainer drops what is then
too stale (`drops`, reason `stale`).

The allowance lets a queue stand. Once it fills (the env workers starved of CPU for a while),
the rule alone never drains it: each waiting rollout that starts is replaced by a new one, those
that start together push the sampling ones past the budget, a share of them goes stale, and
generating that share takes the CPU that would drain the queue. So the allowance is not fixed
(`WaitingAllowance`): while the share of rollouts dropped as stale is above
`stale_drop_target`, it halves each step; once the share is below half the target, it grows back.

A rollout also starts behind when the fleet has not loaded the trainer's newest weights yet.
Once replicas report on the fleet topic, no group is issued while the oldest version a running
replica serves is more than `max_off_policy` behind the trainer's version (so the synchronous loop
waits for the reload, as it should); with no replica reports, only the budget applies. The
trainer's version is taken from its step events, which free the budget too: the weights event of
the same step may arrive later, and a group issued in between would sample the old weights and be
dropped as stale.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from rollwire.core.bounds import RecentKeys
from rollwire.core.bus import AtOffsets, DeadLetters, EventConsumer, EventLog, EventProducer, read_to_end
from rollwire.core.errors import ConfigError
from rollwire.producers.tasksets import TASKSETS, Taskset
from rollwire.schemas.deadletter import DeadLetter
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.feedback import PRODUCTION_GROUP_PREFIX
from rollwire.schemas.rollout import SamplingParams, SamplingStarted, TaskAssigned
from rollwire.schemas.topics import Topics
from rollwire.schemas.training import RolloutsDropped, TrainStepCompleted
from rollwire.schemas.weights import ReplicaStatus, WeightsPublished
from rollwire.streams.advantages import ALGORITHMS
from rollwire.trainer.settings import BatchSettings

logger = logging.getLogger(__name__)


class EnvironmentMix(BaseModel):
    """One environment in the dispatcher's mix."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: Annotated[str, AfterValidator(TASKSETS.check)]
    """A taskset: bundled (`reverse-digits`), an installed package's (`rollwire env list`), or a
    reference, `package.module:Class` or `path/to/file.py[:Class]` (relative to the current folder)."""
    weight: float = Field(default=1.0, gt=0)
    """Share of groups drawn from this environment, relative to the others."""
    algorithm: Annotated[str, AfterValidator(ALGORITHMS.check)] = "grpo"
    """Advantage algorithm for its groups (`rollwire.streams.advantages`)."""
    group_size: int = Field(default=8, ge=1)
    """Rollouts per task."""
    sampling: SamplingParams = SamplingParams()
    """Sampling settings for its rollouts."""


class DispatcherSettings(BaseModel):
    """The dispatcher's own settings; its budget comes from the trainer's `BatchSettings`."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    seed: int = 0
    """Seed of the environment draw."""


def endless(taskset: Taskset) -> Iterator[dict]:
    """The taskset's rows, from the start again after the last. Each pass reads `rows()` anew:
    `itertools.cycle` would keep every row it has handed out, a dispatcher's memory growing with
    the run (a million-row taskset, or reverse-digits' 10^6 generated rows)."""
    while True:
        empty = True
        for row in taskset.rows():
            empty = False
            yield row
        if empty:
            raise ConfigError(f"taskset {taskset.name!r} has no rows")


def may_issue(in_flight: int, group_size: int, max_off_policy: int, batch_rollouts: int, *, sampling: int | None = None,
              waiting_rollouts: int = 0) -> bool:
    """Whether a group of `group_size` fits the off-policy budget (see the module docstring).
    `sampling`: how many of the rollouts in flight have started sampling (None: all of them)."""
    sampling = in_flight if sampling is None else min(sampling, in_flight)
    waiting = in_flight - sampling
    return sampling + max(group_size, waiting + group_size - waiting_rollouts) <= (max_off_policy + 1) * batch_rollouts


def default_waiting_rollouts(budget: BatchSettings) -> int:
    """`BatchSettings.waiting_rollouts`, its default filled in."""
    if budget.waiting_rollouts is not None:
        return budget.waiting_rollouts
    return budget.max_off_policy * (budget.batch_rollouts or 0)


class WaitingAllowance:
    """`waiting_rollouts` as it stands now: halved each step while the smoothed share of rollouts
    dropped as stale is above `target`, grown back to `ceiling` in `RECOVERY_STEPS` steps once the
    share is below half of it (additive increase, multiplicative decrease, as TCP paces a link).
    A few stale drops (a slow group now and then) leave it alone; a standing queue drains."""

    RECOVERY_STEPS = 50
    SMOOTHING = 0.2
    """Weight of the newest step in the smoothed share: about the last five steps count."""

    def __init__(self, ceiling: int, target: float) -> None:
        self.ceiling, self.target = ceiling, target
        self.value = ceiling
        self.share = 0.0
        """The smoothed share of rollouts dropped as stale."""
        self.narrowed = 0
        """Steps at which it halved."""
        self._stale = 0

    def stale(self, count: int) -> None:
        """`count` rollouts dropped as stale."""
        self._stale += count

    def trained(self, count: int) -> None:
        """A step trained `count` rollouts: the share since the last step updates the allowance."""
        seen = count + self._stale
        if seen:
            self.share += self.SMOOTHING * (self._stale / seen - self.share)
        self._stale = 0
        if self.share > self.target and self.value:
            self.value //= 2
            self.narrowed += 1
            if self.narrowed == 1 or self.narrowed % 100 == 0:
                logger.warning("%.0f%% of rollouts dropped as stale (stale_drop_target %.0f%%): the waiting allowance "
                               "halves to %d (of %d), narrowed %d times so far", 100 * self.share, 100 * self.target,
                               self.value, self.ceiling, self.narrowed)
        elif self.share < self.target / 2:
            self.value = min(self.ceiling, self.value + -(-self.ceiling // self.RECOVERY_STEPS))


class Dispatcher:
    def __init__(self, log: EventLog, topics: Topics, mix: Sequence[tuple[EnvironmentMix, Taskset]],
                 budget: BatchSettings, settings: DispatcherSettings | None = None) -> None:
        if not mix:
            raise ConfigError("the dispatcher needs at least one environment")
        if budget.batch_rollouts is None:
            raise ConfigError("the dispatcher paces work in rollouts: set trainer.batch.batch_rollouts "
                              "(batch_tokens may still cap a step)")
        self.topics, self.mix, self.budget = topics, mix, budget
        self.batch_rollouts: int = budget.batch_rollouts
        self.settings = settings or DispatcherSettings()
        self.producer = EventProducer(log.producer(), topics, name="dispatcher")
        self.dead_letters = DeadLetters(self.producer, "dispatcher")
        self.allowance = WaitingAllowance(default_waiting_rollouts(budget), budget.stale_drop_target)
        watched = [topics.train, topics.drops, topics.weights, topics.fleet, topics.deadletter, topics.sampling]
        starts = {(t, p): 0 for t in watched for p in range(log.partitions(t))}
        self.progress = EventConsumer(log.reader(watched, AtOffsets(starts)), self.dead_letters)
        self.served: dict[str, int] = {}
        """Version each running replica serves (from its latest status)."""
        self.published_version = 0
        self.rows: dict[str, Iterator[dict]] = {env.name: endless(taskset) for env, taskset in mix}
        self.rng = random.Random(self.settings.seed)
        self.issued = self.accounted = 0
        self.started = 0
        """Rollouts that sent `SamplingStarted` (each once: a re-run after a worker's crash is recognised)."""
        self._started_ids = RecentKeys(budget.dedupe_window, "dispatcher.started",
                                       what=": a rollout re-run after that many others started is counted twice")
        self.dead_lettered = 0
        """Rollouts counted back because a component dead-lettered them (or their task)."""
        self.policy_version = 0
        self._letters_seen = RecentKeys(budget.dedupe_window, "dispatcher.dead_letters",
                                        what=": a dead letter read again after that many others is counted back twice")
        self._codec = Codec()
        self._count_issued(log)

    def _count_issued(self, log: EventLog) -> None:
        """A restarted dispatcher counts what earlier runs issued, so its budget stays right."""
        for delivery in read_to_end(log, [self.topics.tasks], self.dead_letters):
            self.issued += delivery.event.group_size

    @property
    def in_flight(self) -> int:
        return self.issued - self.accounted

    @property
    def sampling(self) -> int:
        """Rollouts in flight that have started sampling (events read in another order than they
        were sent, across topics, can put this briefly below the truth, never above `in_flight`)."""
        return max(0, min(self.started - self.accounted, self.in_flight))

    def _count_started(self, event: SamplingStarted) -> None:
        if self._started_ids.add((event.group_id, event.sample_index)):
            self.started += 1

    def _read_progress(self, timeout_s: float) -> None:
        deliveries = self.progress.poll_batch(1000, timeout_s)
        while more := self.progress.poll_batch(1000, 0.0):  # everything already there, every partition
            deliveries += more
        for delivery in deliveries:
            event = delivery.event
            if isinstance(event, TrainStepCompleted):  # production samples were never issued here
                self.accounted += len(event.rollout_ids) - event.samples.get("production", 0)
                self.allowance.trained(len(event.rollout_ids))
                self.policy_version = max(self.policy_version, event.policy_version)
            elif isinstance(event, RolloutsDropped):
                self.accounted += 0 if event.production else len(event.rollout_ids)
                if event.reason == "stale" and not event.production:
                    self.allowance.stale(len(event.rollout_ids))
            elif isinstance(event, WeightsPublished):
                self.published_version = max(self.published_version, event.version)
            elif isinstance(event, ReplicaStatus):
                if event.state == "stopped":
                    self.served.pop(event.replica_id, None)
                else:
                    self.served[event.replica_id] = event.serving_version or 0
            elif isinstance(event, SamplingStarted):
                self._count_started(event)
            elif isinstance(event, DeadLetter):
                self._count_back(event)

    def _count_back(self, letter: DeadLetter) -> None:
        """Rollouts a component dead-lettered are neither trained nor dropped: without counting them
        back, each would narrow the budget for good (and a run whose rollouts are all refused would
        stand still). A dead task stands for its whole group."""
        if not self._letters_seen.add((letter.source_topic, letter.partition, letter.offset)):
            return
        if letter.source_topic == self.topics.scored and (letter.key or b"").startswith(PRODUCTION_GROUP_PREFIX.encode()):
            return
        if letter.source_topic in (self.topics.rollouts, self.topics.scored):
            count = 1
        elif letter.source_topic == self.topics.tasks and letter.raw_size == len(letter.raw):
            try:
                count = self._codec.decode(letter.raw).event.group_size
            except SchemaError:  # not a task this dispatcher could have issued
                return
        else:
            return
        self.accounted += count
        self.dead_lettered += count

    @property
    def fleet_caught_up(self) -> bool:
        """Whether every running replica serves a version within `max_off_policy` of the trainer's."""
        newest = max(self.published_version, self.policy_version)
        return not self.served or min(self.served.values()) >= newest - self.budget.max_off_policy

    def step(self, timeout_s: float = 0.5) -> int:
        """Issues every group that fits the budget now; returns how many."""
        self._read_progress(timeout_s)
        issued = 0
        while self.fleet_caught_up:
            env = self.rng.choices([e for e, _ in self.mix], weights=[e.weight for e, _ in self.mix])[0]
            if not may_issue(self.in_flight, env.group_size, self.budget.max_off_policy, self.batch_rollouts,
                             sampling=self.sampling, waiting_rollouts=self.allowance.value):
                break
            row = next(self.rows[env.name])
            task = TaskAssigned(task_id=row["task_id"], environment=env.name, algorithm=env.algorithm,
                                group_size=env.group_size, task=row, sampling=env.sampling,
                                policy_version=self.policy_version)
            self.producer.send(self.topics.tasks, task, key=task.group_id)
            self.issued += env.group_size
            issued += 1
        self.producer.flush()
        return issued

    def close(self) -> None:
        self.progress.close()
        self.producer.close()
