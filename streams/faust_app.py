"""The group scorer on faust-streaming: the scale-out driver on Kafka.

    reads:  <prefix>.rollouts, <prefix>.scorer-ticks   (one agent, co-partitioned, concurrency 1)
    writes: <prefix>.scored, <prefix>.drops, <prefix>.deadletter, <prefix>.scorer-ticks
    table:  `groups`, changelog <prefix>.scorer-state  (the same topic and records as the embedded
            driver: a header per group, a record per rollout; `group_changelog.py`)

Scaling is by partitions: start more workers with the same app id and Kafka splits the rollout
partitions among them; each worker's table holds the groups of its partitions. Agent
concurrency stays 1 because faust can commit past an event still in flight with more
(docs/notes/kafka.md), and recovery resumes the stream partitions only after seeking them
(`faust_recovery.py`: faust's own order lost records on restart). Faust flushes the producer
(outputs and changelog) before it commits offsets, so delivery is at-least-once; consumers
dedupe on rollout id.

Timeouts come as tick records: the leader's timer sends one to every partition of
`scorer-ticks`, and the agent expires the groups of that partition that are due
(`scoring.Deadlines`: a tick visits those only, not the whole table).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import faust
from pydantic import BaseModel, ConfigDict, Field

from rollwire.core import telemetry
from rollwire.core.bus.base import Record
from rollwire.core.bus.events import dead_letter_for, outgoing
from rollwire.core.bus.partitioner import partition_for
from rollwire.core.bus.settings import KafkaBusSettings
from rollwire.schemas.base import now_ms
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.rollout import RolloutCompleted
from rollwire.schemas.scorer import ScorerGroupState, ScorerTick
from rollwire.schemas.topics import Topics
from rollwire.streams import group_changelog
from rollwire.streams.faust_recovery import SeekBeforeFetchTableManager
from rollwire.streams.scoring import Deadlines, GroupScorer, OpenGroups, ScorerSettings, Step, route, scoring_span

logger = logging.getLogger(__name__)


class FaustWorkerSettings(BaseModel):
    """How a faust worker of rollwire (the scorer's, the joiner's: `faust_joiner.py`) runs and names
    itself; where the cluster is comes from the bus settings (`KafkaBusSettings`), the topic names
    from the run's `Topics`."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    app_id: str = "rollwire-scorer"
    """Faust application id: the consumer group, shared by all workers of one processor."""
    tick_s: float = Field(default=1.0, gt=0)
    """Seconds between timeout ticks."""
    commit_interval_s: float = Field(default=1.0, gt=0)
    """Seconds between offset commits (each preceded by a producer flush)."""
    batch_records: int = Field(default=500, ge=1)
    """Most records the agent takes at once; the table's changes of one batch are coalesced per
    key before they reach the changelog (a group that opens and closes within it writes one record)."""
    batch_wait_s: float = Field(default=0.05, gt=0)
    """Longest the agent waits to fill a batch: the latency added when traffic is light."""
    session_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds without heartbeats before Kafka moves a dead worker's partitions to the others."""
    data_dir: Path = Path("runs/default/faust")
    """Where faust keeps its local files (one folder per app id)."""
    replication_factor: int = Field(default=1, ge=1)
    """Replicas of the topics faust creates for itself (its leader-election topic); use 3 on a
    production cluster. Catalog topics are created beforehand and keep their own settings."""


def message_headers(message: Any) -> list[tuple[str, bytes]]:
    headers = message.headers or []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(k, v) for k, v in items if isinstance(v, bytes)]


class GroupTable(faust.Table):
    """The `groups` table. Its keys are a group id, or a group id and a sample index
    (`group_changelog.py`), and each goes to the changelog partition of its group, the partition
    the group's rollouts arrive on: so a batch's changes can be written after the batch, not only
    while the record that caused them is current (faust's default partition for a table key)."""

    def partition_for_key(self, key: Any) -> int:
        group_id = key.split(group_changelog.SEPARATOR.encode(), 1)[0]
        return partition_for(group_id, self.partitions)


def record_of(event: Any, default_topic: str) -> Record:
    """The `Record` of a faust stream event (the topic `default_topic` when faust gives none)."""
    m = event.message
    return Record(topic=m.topic or default_topic, partition=m.partition, offset=m.offset, key=m.key, value=m.value,
                  timestamp_ms=int(m.timestamp * 1000), headers=tuple(message_headers(m)))


def table_event(table: Any, key: bytes, codec: Codec, what: str) -> Any:
    """The event a table holds under `key`, or None; a value that does not decode is logged and
    forgotten (faust keeps no offset for table values, so there is no record to dead-letter)."""
    data = table.get(key)
    if not data:
        return None
    try:
        return codec.decode(data).event
    except SchemaError as exc:
        logger.error("%s value under %r does not decode, forgetting it: %s", what, key, exc)
        table.pop(key, None)
        return None


def add_ticks(app: faust.App, topic: Any, partitions: int, settings: FaustWorkerSettings, codec: Codec) -> None:
    """A timer on the leader worker that sends a `ScorerTick` to every partition of `topic` each
    `tick_s`: each partition's agent then does its time-driven work for the keys it owns."""

    @app.timer(interval=settings.tick_s, on_leader=True)
    async def tick() -> None:
        value = codec.encode(ScorerTick(), producer=settings.app_id)
        for p in range(partitions):
            await topic.send(value=value, partition=p)


Sink = Callable[[str, bytes | None, bytes, list[tuple[str, bytes]]], Awaitable[None]]
"""`await sink(topic_name, key, value, headers)`: where the agent's output records go."""


def faust_app(settings: FaustWorkerSettings, bus: KafkaBusSettings) -> faust.App:
    """The faust app the scorer runs in, with no agent yet: its cluster, commit and recovery settings."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # faust creates only the last level
    return faust.App(
        settings.app_id,
        broker=[f"kafka://{s.strip()}" for s in bus.bootstrap_servers.split(",")],
        broker_credentials=bus.security.faust_credentials(),
        datadir=str(settings.data_dir / settings.app_id),
        store="memory://",
        autodiscover=False,
        web_enabled=False,
        table_standby_replicas=0,
        topic_replication_factor=settings.replication_factor,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.commit_interval_s,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=max(0.5, settings.session_timeout_s / 5),
        producer_acks=-1,
        processing_guarantee="at_least_once",
        TableManager=SeekBeforeFetchTableManager,
    )


def build_app(settings: FaustWorkerSettings, scorer_settings: ScorerSettings, *, bus: KafkaBusSettings,
              topics: Topics, teacher=None, sink: Sink | None = None) -> faust.App:
    """A faust app with the scoring agent, the tick timer and the group table. Outputs go to
    their Kafka topics, or to `sink` when given (for broker-free tests of the agent)."""
    scorer = GroupScorer(scorer_settings, teacher=teacher)
    codec = Codec()
    app = faust_app(settings, bus)
    raw = {"schema": faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")}
    partitions = topics.spec(topics.rollouts).partitions
    state_topic = app.topic(topics.name("scorer-state"), partitions=partitions, internal=False, **raw)
    ticks_topic = app.topic(topics.name("scorer-ticks"), partitions=partitions, internal=False, **raw)
    groups = app.tables.add(GroupTable(app, name="groups", default=None, partitions=partitions,
                                       changelog_topic=state_topic, beacon=app.tables.beacon, **raw))
    outputs = {name: app.topic(topics.name(name), internal=False, **raw)
               for name in ("scored", "drops", "deadletter")}

    async def send(topic_name: str, event, key: str) -> None:
        with outgoing(topics, codec, settings.app_id, topics.name(topic_name), event, key) as out:
            if sink is not None:
                await sink(topics.name(topic_name), out.key, out.value, out.headers)
            else:
                await outputs[topic_name].send(key=out.key, value=out.value, headers=out.headers)

    # The table holds encoded records (`group_changelog.py`: a header per group, a record per
    # rollout); `held` holds the groups decoded, rebuilt from the table after a rebalance, and
    # always current: the table catches up at the end of each batch, from `pending`.
    held: dict[str, ScorerGroupState | None] = {}
    pending = group_changelog.PendingWrites()
    # Per rollout partition, when its groups are next due for a tick (`scoring.Deadlines`): built
    # from the table by the partition's first tick after an assignment, then kept by `apply`.
    deadlines: dict[int, Deadlines] = {}
    # Per rollout partition, its open groups oldest first (`scoring.OpenGroups`), for
    # `max_open_groups` over the whole worker; built like `deadlines`, kept by `apply`.
    open_groups: dict[int, OpenGroups] = {}

    @app.on_partitions_revoked.connect
    async def forget_decoded(*_args: Any, **_kwargs: Any) -> None:
        held.clear()
        deadlines.clear()
        open_groups.clear()

    def group_keys(partition: int) -> list[str]:
        return [k.decode() for k in list(groups.keys())
                if group_changelog.is_group_key(k) and partition_for(k, partitions) == partition]

    def open_in(partition: int) -> OpenGroups:
        if partition not in open_groups:  # the first need since the assignment: one pass over the table
            open_groups[partition] = OpenGroups.of(scorer.settings.max_open_groups,
                                                   ((g, state_of(g)) for g in group_keys(partition)))
        return open_groups[partition]

    async def make_room(group_id: str) -> None:
        """Before `group_id` opens: past `max_open_groups` (all partitions held), the oldest open
        group of its partition is closed early."""
        mine = open_in(partition_for(group_id.encode(), partitions))
        held_open = sum(len(o) for o in open_groups.values())
        oldest = mine.oldest()
        if held_open >= scorer.settings.max_open_groups and oldest is not None:
            state = state_of(oldest)
            if state is not None:
                await apply(oldest, scorer.overflow(state, held_open))

    async def apply(group_id: str, step: Step) -> None:
        for event in step.events:
            with scoring_span(event):
                await send(route(event), event, group_id)
        pending.add(group_changelog.writes(group_id, state_of(group_id), step))
        if step.changed:
            held[group_id] = step.state
            partition = partition_for(group_id.encode(), partitions)
            schedule = deadlines.get(partition)
            if schedule is not None:
                schedule.push(group_id, step.state)
            if partition in open_groups:
                open_groups[partition].note(group_id, step.state)

    def due(partition: int, now: int) -> list[str]:
        """The groups of `partition` due for a tick."""
        if partition not in deadlines:  # the first tick since the assignment: one pass over the table
            deadlines[partition] = Deadlines(scorer.settings)
            for group_id in group_keys(partition):
                deadlines[partition].push(group_id, state_of(group_id))
        return deadlines[partition].due(now)

    def write_table() -> None:
        """The batch's changes, coalesced, into the table (faust sends each to the changelog)."""
        for key, record in pending.drain():
            if record is None:
                groups.pop(key.encode(), None)
            else:
                groups[key.encode()] = codec.encode(record, producer=settings.app_id)

    def stored(key: bytes):
        return table_event(groups, key, codec, "scorer-state")

    def state_of(group_id: str) -> ScorerGroupState | None:
        if group_id not in held:
            group = stored(group_id.encode())
            if isinstance(group, ScorerGroupState):
                keys = (group_changelog.rollout_key(group_id, i).encode() for i in range(group.group_size))
                records = [stored(k) for k in keys if k in groups]
                group = group_changelog.assemble(group, [r.rollout for r in records if r is not None])
            held[group_id] = group if isinstance(group, ScorerGroupState) else None
        return held[group_id]

    @app.agent(app.topic(topics.rollouts, topics.name("scorer-ticks"), **raw), concurrency=1)
    async def score(stream) -> None:
        # faust acks a batch's records after the loop body ran for it, so the offsets committed
        # never pass a record whose outputs and table changes were not yet sent.
        async for batch in stream.take_events(settings.batch_records, within=settings.batch_wait_s):
            for event in batch:
                record = record_of(event, topics.rollouts)
                with telemetry.process_span(record.topic, record.partition, record.offset, record.headers,
                                            settings.app_id):
                    await handle(record)
            write_table()

    async def handle(record: Record) -> None:
        logger.debug("scorer record %s[%d]@%d key=%r", record.topic, record.partition, record.offset, record.key)
        if record.value is None:
            return
        try:
            decoded = codec.decode(record.value).event
        except SchemaError as exc:
            await send("deadletter", dead_letter_for(record, exc, stage="decode", component="scorer"), record.topic)
            return
        if isinstance(decoded, ScorerTick):
            write_table()  # groups opened earlier in this batch are in the table too
            now = now_ms()
            for group_id in due(record.partition, now):
                state = state_of(group_id)
                if state is not None:
                    await apply(group_id, scorer.on_tick(state, now=now))
            return
        if not isinstance(decoded, RolloutCompleted):
            await send("deadletter", dead_letter_for(record, f"{decoded.type} does not belong on {record.topic}",
                                                     stage="process", component="scorer"), record.topic)
            return
        if state_of(decoded.group_id) is None:
            await make_room(decoded.group_id)
        step = scorer.on_rollout(state_of(decoded.group_id), decoded)
        if step.rejected:
            await send("deadletter", dead_letter_for(record, step.rejected, stage="process", component="scorer"),
                       record.topic)
        await apply(decoded.group_id, step)

    add_ticks(app, ticks_topic, partitions, settings, codec)
    return app


def run_worker(app: faust.App, loglevel: str = "warning") -> None:
    """Runs the faust worker in this process until SIGTERM or Ctrl-C."""
    from faust.worker import Worker
    worker = Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    # faust's start-up spinner turns the root logger to DEBUG so that it spins on every record:
    # every library's debug call then builds a LogRecord (a tenth of the worker's time, measured).
    worker.spinner = None
    worker.execute_from_commandline()
