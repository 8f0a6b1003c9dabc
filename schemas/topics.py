"""The topic catalog: every topic, what flows on it, its key, and who writes and reads it.

Topic names are `<prefix>.<name>`; the prefix (default `rollwire`) lets several runs — or every
test — own a separate set of topics on one broker. The documentation's topic page is generated
from this catalog when the site is built (`docs/_gen/pages.py`; `rollwire topics --markdown`
prints the same table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rollwire.core.errors import ConfigError
from rollwire.schemas.base import Event
from rollwire.schemas.deadletter import DeadLetter
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, PartnerRecord, SourceBaseline
from rollwire.schemas.registry import type_tag
from rollwire.schemas.rollout import RolloutCompleted, SamplingStarted, ScoredRollout, TaskAssigned, TraceRecorded
from rollwire.schemas.scorer import ScorerGroupRollout, ScorerGroupState, ScorerTick
from rollwire.schemas.serving import ResponseServed
from rollwire.schemas.training import RolloutsDropped, TrainStepCompleted
from rollwire.schemas.weights import ReplicaStatus, ServingDecision, WeightsPublished

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    """One topic of the loop."""

    name: str
    """Short name; the full topic name is `<prefix>.<name>`."""
    events: tuple[type[Event], ...]
    """Event types allowed on the topic."""
    key: str
    """What the record key holds (records with one key stay in order on one partition)."""
    partitions: int
    """Partition count: the most consumers of one group that can share the work."""
    cleanup: Literal["delete", "compact"]
    """`compact` keeps the latest record per key forever; `delete` drops records after retention."""
    retention_ms: int | None
    """How long records are kept under `delete`; None keeps them forever."""
    producer: str
    """Components that write the topic."""
    consumer: str
    """Components that read the topic."""
    copies: tuple[type[Event], ...] = ()
    """Event types that also travel here as copies of another topic's records (a stream re-keyed for
    a stream processor) or as its timer ticks; `events` names each type's own topic."""


CATALOG: tuple[TopicSpec, ...] = (
    TopicSpec("tasks", (TaskAssigned,), "group id", 4, "delete", 7 * DAY_MS,
              "dispatcher", "env workers"),
    TopicSpec("rollouts", (RolloutCompleted,), "group id", 4, "delete", 7 * DAY_MS,
              "env workers", "group scorer"),
    TopicSpec("sampling", (SamplingStarted,), "group id", 1, "delete", 7 * DAY_MS,
              "env workers", "dispatcher (the off-policy budget counts a rollout from here)"),
    TopicSpec("traces", (TraceRecorded,), "group id", 4, "delete", 7 * DAY_MS,
              "env workers", "debugging and replay tools"),
    TopicSpec("scored", (ScoredRollout,), "group id", 4, "delete", 7 * DAY_MS,
              "group scorer, feedback joiner", "trainer"),
    TopicSpec("drops", (RolloutsDropped,), "group id", 1, "delete", 30 * DAY_MS,
              "group scorer, trainer, feedback joiner", "accounting, run display"),
    TopicSpec("weights", (WeightsPublished,), "policy name", 1, "compact", None,
              "trainer", "weight subscribers, dispatcher"),
    TopicSpec("fleet", (ReplicaStatus,), "replica id", 1, "delete", 7 * DAY_MS,
              "weight subscribers", "dispatcher, run display"),
    TopicSpec("serving", (ServingDecision,), "policy name", 1, "delete", None,
              "`rollwire promote`, `rollwire rollback`", "serving replicas, serving gateway"),
    TopicSpec("train", (TrainStepCompleted,), "policy name", 1, "delete", 30 * DAY_MS,
              "trainer", "dispatcher, run display, metrics"),
    TopicSpec("feedback", (FeedbackReceived,), "conversation id", 4, "delete", 30 * DAY_MS,
              "production apps (feedback ingestion)", "feedback joiner"),
    TopicSpec("served", (ResponseServed,), "conversation id", 4, "delete", 30 * DAY_MS,
              "serving gateway", "feedback joiner"),
    TopicSpec("deadletter", (DeadLetter,), "source topic", 1, "delete", 30 * DAY_MS,
              "every consumer", "dispatcher (counts refused rollouts back), operators, replay tools"),
    TopicSpec("scorer-state", (ScorerGroupState, ScorerGroupRollout), "group id (NUL sample index)", 4, "compact", None,
              "group scorer", "group scorer (restoring its table)"),
    TopicSpec("scorer-ticks", (ScorerTick,), "partition", 4, "delete", DAY_MS,
              "group scorer timer (faust)", "group scorer (faust)"),
    TopicSpec("joiner-state", (FeedbackJoinState, SourceBaseline), "receipt (NUL source)", 4, "compact", None,
              "feedback joiner", "feedback joiner (restoring its state)"),
    TopicSpec("joiner-in", (PartnerRecord,), "receipt", 4, "delete", 7 * DAY_MS,
              "feedback joiner (faust: its inputs re-keyed by receipt, messages between receipts, ticks)",
              "feedback joiner (faust)", copies=(ResponseServed, FeedbackReceived, ScorerTick)),
)

_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")


GroupRole = Literal["env-worker", "scorer", "joiner"]
"""The roles that read in a consumer group (`Topics.group`)."""


class Topics:
    """Full topic names for one prefix: `Topics("run7").rollouts == "run7.rollouts"`."""

    def __init__(self, prefix: str = "rollwire") -> None:
        if not _PREFIX.match(prefix):
            raise ConfigError(f"topic prefix {prefix!r} is invalid: use letters, digits, '.', '_' "
                              "or '-' (at most 101 characters, starting with a letter or digit)")
        self.prefix = prefix
        self._by_full = {f"{prefix}.{spec.name}": spec for spec in CATALOG}

    def __getattr__(self, name: str) -> str:
        for spec in CATALOG:
            if spec.name == name:
                return f"{self.prefix}.{name}"
        raise AttributeError(f"no topic named {name!r} in the catalog")

    def name(self, short: str) -> str:
        """Full name of the topic `short`."""
        return getattr(self, short)

    def group(self, role: GroupRole) -> str:
        """The consumer group of a role that reads these topics in a group (`env-worker`, `scorer`,
        `joiner`): `<prefix>-<role>`. A process started by hand beside a run joins the run's group.
        On Kafka it is also the faust app id of the stream processors."""
        return f"{self.prefix}-{role}"

    def specs(self) -> list[tuple[str, TopicSpec]]:
        """(full name, spec) for every topic of the catalog."""
        return list(self._by_full.items())

    def spec(self, full_name: str) -> TopicSpec:
        """The spec of a full topic name; raises `ConfigError` for a name outside this catalog."""
        try:
            return self._by_full[full_name]
        except KeyError:
            raise ConfigError(f"topic {full_name!r} is not in the catalog for prefix "
                              f"{self.prefix!r}; known: {', '.join(self._by_full)}") from None

    def check(self, full_name: str, event: Event) -> None:
        """Raises `ConfigError` when `event`'s type is not declared for `full_name`."""
        spec = self.spec(full_name)
        if not isinstance(event, spec.events + spec.copies):
            allowed = ", ".join(type_tag(e) for e in spec.events + spec.copies)
            raise ConfigError(f"{type_tag(type(event))} events do not belong on {full_name} "
                              f"(it carries {allowed}); see rollwire.schemas.topics.CATALOG")


def markdown_table(prefix: str = "rollwire") -> str:
    """The topic table of the documentation (and of `rollwire topics --markdown`), from the catalog."""
    rows = ["| topic | events | key | partitions | cleanup | producer | consumer |",
            "|---|---|---|---|---|---|---|"]
    for spec in CATALOG:
        events = ", ".join([f"`{type_tag(e)}`" for e in spec.events] + [f"(`{type_tag(e)}`)" for e in spec.copies])
        cleanup = "compact" if spec.cleanup == "compact" else (
            f"delete after {spec.retention_ms // DAY_MS} d" if spec.retention_ms else "keep")
        rows.append(f"| `{prefix}.{spec.name}` | {events} | {spec.key} | {spec.partitions} | "
                    f"{cleanup} | {spec.producer} | {spec.consumer} |")
    return "\n".join(rows)
