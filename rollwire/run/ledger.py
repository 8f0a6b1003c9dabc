"""A run's accounts, from its events alone (`rollwire inspect run`): what became of every rollout
the dispatcher asked for, and whether steps, versions and replicas kept their promises.

    tasks ─ rollouts ─ scored ─ drops ─ train ─ weights ─ fleet ──▶ RunLedger ──▶ text / problems()

A dispatched rollout is one slot of a task's group: (group id, sample index). The env worker may
record a slot more than once (killed after publishing, before committing, it runs the task again);
the scorer then drops the copy as a duplicate. So each slot ends as exactly one of:

    trained     some rollout of the slot is in a trainer step (and only one, in only one step)
    dropped     no rollout of it trained; a drop event gives the reason
    in flight   neither, yet: waiting to be recorded, scored, or taken by the trainer

The promises checked by `problems()`: no slot trained twice, no rollout in two steps, no step
number twice, published versions strictly increasing, every replica's last word the newest version.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from rollwire.core.bus import EventLog, HeldDeadLetters, read_to_end
from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout, TaskAssigned
from rollwire.schemas.topics import Topics
from rollwire.schemas.training import RolloutsDropped, TrainStepCompleted
from rollwire.schemas.weights import ReplicaStatus, WeightsPublished

Slot = tuple[str, int]
"""A dispatched rollout: (group id, sample index)."""


@dataclass
class RunLedger:
    dispatched: int = 0
    """Rollouts asked for: the group sizes of every task on `tasks`."""
    trained: int = 0
    """Dispatched rollouts trained on."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Dispatched rollouts never trained, by the (first) reason given for dropping one of their records."""
    in_flight: Counter[str] = field(default_factory=Counter)
    """Dispatched rollouts neither trained nor dropped, by where they are: `not recorded`,
    `recorded, not scored`, `scored, not trained`."""
    recorded_again: int = 0
    """Records of a slot beyond its first (an env worker that ran a task again)."""
    trained_twice: list[Slot] = field(default_factory=list)
    """Slots with more than one trained rollout: must stay empty."""
    rollouts_in_two_steps: list[str] = field(default_factory=list)
    """Rollout ids that more than one step trained on: must stay empty."""
    trained_other: int = 0
    """Trained samples from no dispatched task (production feedback)."""
    steps: list[int] = field(default_factory=list)
    """Trainer step numbers, in the order of the `train` topic."""
    versions: dict[str, list[int]] = field(default_factory=dict)
    """Published versions per policy, in the order of the `weights` topic."""
    replicas: dict[str, int | None] = field(default_factory=dict)
    """Per replica, the version its last `serving` report named."""
    unreadable: int = 0

    @property
    def repeated_steps(self) -> list[int]:
        return sorted(step for step, n in Counter(self.steps).items() if n > 1)

    @property
    def newest_version(self) -> int | None:
        return max((v for vs in self.versions.values() for v in vs), default=None)

    @property
    def accounted(self) -> bool:
        """Every dispatched rollout is trained, dropped or in flight (each exactly one)."""
        return self.trained + sum(self.dropped.values()) + sum(self.in_flight.values()) == self.dispatched

    def problems(self) -> list[str]:
        """Each promise the run broke, in a sentence; empty when it kept them all."""
        found = []
        if not self.accounted:
            found.append(f"{self.dispatched} rollouts dispatched but {self.trained} trained, "
                         f"{sum(self.dropped.values())} dropped, {sum(self.in_flight.values())} in flight")
        if self.trained_twice:
            found.append(f"{len(self.trained_twice)} dispatched rollouts trained more than once, "
                         f"e.g. group {self.trained_twice[0][0]} sample {self.trained_twice[0][1]}")
        if self.rollouts_in_two_steps:
            found.append(f"{len(self.rollouts_in_two_steps)} rollouts in more than one step, "
                         f"e.g. {self.rollouts_in_two_steps[0]}")
        if self.repeated_steps:
            found.append(f"step numbers repeated: {self.repeated_steps[:10]}")
        for policy, versions in self.versions.items():
            if any(b <= a for a, b in zip(versions, versions[1:])):
                found.append(f"{policy}'s published versions do not strictly increase: {versions}")
        newest = self.newest_version
        behind = {r: v for r, v in self.replicas.items() if newest is not None and v != newest}
        if behind:
            found.append(f"replicas not on the newest version {newest}: " +
                         ", ".join(f"{r} on {v}" for r, v in sorted(behind.items())))
        return found


def run_ledger(log: EventLog, topics: Topics) -> RunLedger:
    """Reads the run's topics to the end they have now and settles its accounts."""
    unread = HeldDeadLetters("ledger")
    ledger = RunLedger()
    slots: set[Slot] = set()
    slot_of: dict[str, Slot] = {}
    recorded: Counter[Slot] = Counter()
    scored: set[Slot] = set()
    drops: list[RolloutsDropped] = []
    trained_rollouts: Counter[str] = Counter()
    for d in read_to_end(log, [topics.tasks, topics.rollouts, topics.scored, topics.drops, topics.train,
                               topics.weights, topics.fleet], unread):
        event = d.event
        if isinstance(event, TaskAssigned):
            slots.update((event.group_id, i) for i in range(event.group_size))
            ledger.dispatched += event.group_size
        elif isinstance(event, RolloutCompleted):
            slot = (event.group_id, event.sample_index)
            slot_of[event.rollout_id] = slot
            recorded[slot] += 1
        elif isinstance(event, ScoredRollout):
            slot = (event.rollout.group_id, event.rollout.sample_index)
            scored.add(slot)
        elif isinstance(event, RolloutsDropped):  # topics interleave: resolved once all is read
            drops.append(event)
        elif isinstance(event, TrainStepCompleted):
            ledger.steps.append(event.step)
            trained_rollouts.update(event.rollout_ids)
        elif isinstance(event, WeightsPublished):
            ledger.versions.setdefault(event.policy, []).append(event.version)
        elif isinstance(event, ReplicaStatus) and event.state == "serving":
            ledger.replicas[event.replica_id] = event.serving_version
    ledger.unreadable = len(unread.held)
    drop_reason: dict[Slot, str] = {}
    for drop in drops:
        if drop.reason == "duplicate":  # a copy: the slot's first record goes on (counted in recorded_again)
            continue
        for rollout_id in drop.rollout_ids:
            if rollout_id in slot_of:
                drop_reason.setdefault(slot_of[rollout_id], drop.reason)
    ledger.rollouts_in_two_steps = sorted(r for r, n in trained_rollouts.items() if n > 1)
    trained_per_slot: dict[Slot, int] = defaultdict(int)
    for rollout_id in trained_rollouts:
        found = slot_of.get(rollout_id)
        if found is not None and found in slots:
            trained_per_slot[found] += 1
        else:
            ledger.trained_other += 1
    ledger.trained_twice = sorted(s for s, n in trained_per_slot.items() if n > 1)
    ledger.recorded_again = sum(n - 1 for n in recorded.values() if n > 1)
    for slot in slots:
        if slot in trained_per_slot:
            ledger.trained += 1
        elif slot in drop_reason:
            ledger.dropped[drop_reason[slot]] += 1
        elif not recorded[slot]:
            ledger.in_flight["not recorded"] += 1
        elif slot not in scored:
            ledger.in_flight["recorded, not scored"] += 1
        else:
            ledger.in_flight["scored, not trained"] += 1
    return ledger


def render_ledger(ledger: RunLedger) -> str:
    def counts(counter: Counter[str]) -> str:
        return ", ".join(f"{n} {what}" for what, n in counter.most_common()) or "none"

    lines = [f"dispatched rollouts  {ledger.dispatched}",
             f"  trained            {ledger.trained}",
             f"  dropped            {sum(ledger.dropped.values())} ({counts(ledger.dropped)})",
             f"  in flight          {sum(ledger.in_flight.values())} ({counts(ledger.in_flight)})",
             f"recorded again       {ledger.recorded_again} (copies of a rollout an env worker ran twice)"]
    if ledger.trained_other:
        lines.append(f"other samples        {ledger.trained_other} trained (production feedback)")
    steps = ledger.steps
    lines.append(f"trainer steps        {len(steps)}" + (f" ({min(steps)}..{max(steps)})" if steps else "") +
                 (f", repeated: {ledger.repeated_steps}" if ledger.repeated_steps else ", none repeated"))
    for policy, versions in ledger.versions.items():
        lines.append(f"published versions   {policy}: {len(versions)}" +
                     (f" ({versions[0]}..{versions[-1]})" if versions else ""))
    for replica, version in sorted(ledger.replicas.items()):
        lines.append(f"replica              {replica} last served version {version}")
    if ledger.unreadable:
        lines.append(f"unreadable records   {ledger.unreadable} (see the dead-letter topic)")
    problems = ledger.problems()
    lines.append("promises kept        " + ("all" if not problems else "NO"))
    lines += [f"  broken: {problem}" for problem in problems]
    return "\n".join(lines) + "\n"
