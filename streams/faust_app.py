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
`scorer-ticks`, and the agent expires the groups of that partition that are due (a tick visits
those only, not the whole table).

What the scorer holds between records lives in its host (`scorer_host.py`), which the in-process
driver feeds too; this driver feeds it, sends what it returns, and writes its changes to the table
at the end of each batch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
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
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.rollout import RolloutCompleted
from rollwire.schemas.scorer import ScorerGroupState, ScorerTick
from rollwire.schemas.topics import Topics
from rollwire.streams import group_changelog
from rollwire.streams.faust_recovery import SeekBeforeFetchRecovery, SeekBeforeFetchTableManager
from rollwire.streams.host import Output
from rollwire.streams.scorer_host import ScorerHost
from rollwire.streams.scoring import GroupScorer, ScorerSettings, scoring_span

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
    startup_timeout_s: float = Field(default=300.0, gt=0)
    """A worker whose start (its table's recovery from the changelog) has not finished after this
    long exits with code 3 and the reason, for its supervisor to start it again. Raise it for a
    changelog that takes longer to read."""
    stall_timeout_s: float = Field(default=120.0, gt=0)
    """A started worker that leaves a record of a partition it owns uncommitted this long exits with
    code 4, for its supervisor to start it again (its stream stopped with its process alive:
    `Liveness`); the time a broker is away does not count. Raise it, with `startup_timeout_s`, for a
    changelog whose recovery after a rebalance takes longer."""


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


class Liveness:
    """Whether a worker's agent keeps up with its input, judged from the broker: the records on a
    partition the worker owns past its consumer group's committed offset are taken and committed
    within seconds by a healthy agent. A record that has waited `stall_timeout_s` is a worker whose
    stream stopped while its process lives on: a restarted scorer was seen (chaos run, 2026-12-05)
    to read its ticks and never again its rollouts, every rollout of the run waiting on it.

    A check that cannot reach the broker, or that took long (an outage), starts the watch over:
    records wait while the broker is away, through no fault of the worker's."""

    SLOW_CHECK_S = 5.0
    """A check longer than this met a broker in trouble: what it saw does not count."""

    def __init__(self, bus: KafkaBusSettings, group_id: str, topics: list[str], stall_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.group_id, self.topics, self.stall_timeout_s, self.clock = group_id, topics, stall_timeout_s, clock
        self.bus = bus.model_copy(update={"outage_s": min(bus.outage_s, self.SLOW_CHECK_S)})  # a check waits no longer
        self._log: Any = None
        self._waiting: dict[tuple[str, int], tuple[int, float]] = {}
        """Per owned partition: its end offset when first seen ahead of the committed one, and when."""

    def observe(self, ends: dict[tuple[str, int], int], committed: dict[tuple[str, int], int],
                owned: set[tuple[str, int]]) -> float:
        """Takes one look at the owned partitions' end and committed offsets; returns how long the
        oldest record not yet committed has been seen waiting (0 when none)."""
        now = self.clock()
        for tp in list(self._waiting):
            end, _since = self._waiting[tp]
            if tp not in owned or committed.get(tp, 0) >= end:
                del self._waiting[tp]
        for tp in owned:
            if tp not in self._waiting and tp in ends and ends[tp] > committed.get(tp, 0):
                self._waiting[tp] = (ends[tp], now)
        return max((now - since for _end, since in self._waiting.values()), default=0.0)

    def forget(self) -> None:
        self._waiting.clear()

    def check(self, owned: set[tuple[str, int]]) -> float:
        """`observe` on what the cluster says now; 0 when it cannot say."""
        from rollwire.core.bus import open_log
        started = self.clock()
        try:
            if self._log is None:
                self._log = open_log(self.bus)
            ends = {(t, p): o for t in self.topics for p, o in self._log.end_offsets(t).items()}
            committed = {(t, p): o for t in self.topics for p, o in self._log.committed(self.group_id, t).items()}
        except Exception as exc:  # a broker away, a topic not there yet: no verdict
            logger.debug("liveness check of %s failed: %s", self.group_id, exc)
            self.forget()
            return 0.0
        if self.clock() - started > self.SLOW_CHECK_S:
            self.forget()
            return 0.0
        return self.observe(ends, committed, owned)


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


class TableGroups:
    """The groups in faust's `groups` table (`ScorerHost`'s store): a header record per group and a
    record per rollout it holds (`group_changelog.py`)."""

    def __init__(self, table: Any, codec: Codec, partitions: int) -> None:
        self.table, self.codec, self.partitions = table, codec, partitions

    def group(self, group_id: str) -> ScorerGroupState | None:
        group = table_event(self.table, group_id.encode(), self.codec, "scorer-state")
        if not isinstance(group, ScorerGroupState):
            return None
        keys = (group_changelog.rollout_key(group_id, i).encode() for i in range(group.group_size))
        records = [table_event(self.table, k, self.codec, "scorer-state") for k in keys if k in self.table]
        return group_changelog.assemble(group, [r.rollout for r in records if r is not None])

    def group_ids(self, partition: int) -> list[str]:
        return [k.decode() for k in list(self.table.keys())
                if group_changelog.is_group_key(k) and partition_for(k, self.partitions) == partition]


def build_app(settings: FaustWorkerSettings, scorer_settings: ScorerSettings, *, bus: KafkaBusSettings,
              topics: Topics, teacher=None, sink: Sink | None = None) -> faust.App:
    """A faust app with the scoring agent (feeding a `ScorerHost`), the tick timer and the group
    table. Outputs go to their Kafka topics, or to `sink` when given (for broker-free tests)."""
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
    # The host decodes the groups from the table as it needs them; after a rebalance it starts over.
    host = ScorerHost(GroupScorer(scorer_settings, teacher=teacher), partitions, TableGroups(groups, codec, partitions))

    @app.on_partitions_revoked.connect
    async def forget_decoded(*_args: Any, **_kwargs: Any) -> None:
        host.reset(TableGroups(groups, codec, partitions))

    async def send(topic_name: str, event, key: str) -> None:
        with outgoing(topics, codec, settings.app_id, topics.name(topic_name), event, key) as out:
            if sink is not None:
                await sink(topics.name(topic_name), out.key, out.value, out.headers)
            else:
                await outputs[topic_name].send(key=out.key, value=out.value, headers=out.headers)

    async def send_all(scored: list[Output]) -> None:
        for out in scored:
            with scoring_span(out.event):
                await send(out.topic, out.event, out.key)

    def write_table() -> None:
        """The batch's changes, coalesced, into the table (faust sends each to the changelog)."""
        for key, record in host.writes():
            if record is None:
                groups.pop(key.encode(), None)
            else:
                groups[key.encode()] = codec.encode(record, producer=settings.app_id)

    add_ticks(app, ticks_topic, partitions, settings, codec)

    @app.agent(app.topic(*scorer_inputs(topics), **raw), concurrency=1)
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
            await send_all(host.tick(partitions=[record.partition]))
        elif isinstance(decoded, RolloutCompleted):
            applied = host.rollout(decoded)
            if applied.rejected:
                await send("deadletter", dead_letter_for(record, applied.rejected, stage="process", component="scorer"),
                           record.topic)
            await send_all(applied.outputs)
        else:
            await send("deadletter", dead_letter_for(record, f"{decoded.type} does not belong on {record.topic}",
                                                     stage="process", component="scorer"), record.topic)

    return app


STARTUP_FAILED = 3
"""Exit code of a worker that did not finish starting within `startup_timeout_s`."""
STALLED = 4
"""Exit code of a started worker whose agent took no record for `stall_timeout_s` (`Liveness`)."""


def scorer_inputs(topics: Topics) -> list[str]:
    """The topics the scorer's agent reads."""
    return [topics.rollouts, topics.name("scorer-ticks")]


def run_worker(app: faust.App, loglevel: str = "warning", *, startup_timeout_s: float | None = None,
               liveness: Liveness | None = None) -> None:
    """Runs the faust worker in this process until SIGTERM or Ctrl-C. Past `startup_timeout_s`
    without having started (faust starts an app's tasks once its tables are recovered), it exits
    with `STARTUP_FAILED`; started, once `liveness` has seen a record wait its `stall_timeout_s`,
    with `STALLED`. A restarted scorer was seen to stay in recovery for good (chaos run, 2026-12-03),
    and another to start and never read a partition (2026-12-05), its consumer group stable and
    every rollout waiting on it: exiting hands the worker back to its supervisor, which starts it
    again. faust's recovery logs at INFO, for the record."""
    from faust.worker import Worker
    started = threading.Event()

    @app.task
    async def mark_started() -> None:
        started.set()

    def give_up(code: int, reason: str, *args: object) -> None:
        logger.error(reason + ": exiting with code %d so that its supervisor starts it again", *args, code)
        logging.shutdown()
        os._exit(code)

    def watch() -> None:
        if not started.wait(startup_timeout_s):
            give_up(STARTUP_FAILED, "faust worker %s did not finish starting within %.0f s (its tables' recovery "
                    "never completed)", app.conf.id, startup_timeout_s)
        if liveness is None:
            return
        while True:
            time.sleep(min(5.0, liveness.stall_timeout_s / 4))
            try:
                owned = {(tp.topic, tp.partition) for tp in set(app.consumer.assignment())}
            except RuntimeError:  # the assignment changed under us: look again
                continue
            if (stalled := liveness.check(owned)) > liveness.stall_timeout_s:
                give_up(STALLED, "faust worker %s left a record of a partition it owns uncommitted for %.0f s (its "
                        "stream stopped)", app.conf.id, stalled)

    if startup_timeout_s is not None or liveness is not None:
        threading.Thread(target=watch, name="worker-watchdog", daemon=True).start()
    for recovery in ("faust.tables.recovery", SeekBeforeFetchRecovery.__module__):  # a service logs as its module
        logging.getLogger(recovery).setLevel(logging.INFO)
    worker = Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    # faust's start-up spinner turns the root logger to DEBUG so that it spins on every record:
    # every library's debug call then builds a LogRecord (a tenth of the worker's time, measured).
    worker.spinner = None
    worker.execute_from_commandline()
